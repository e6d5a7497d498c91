"""The env ring: EnvSplit over real CartPole, ChunkBuilder by script, and a real actor process.

In the process test the test itself plays inference server 0 (a ROUTER) and
learner process 0 (a PULL) of the stream table, answers every
request with values that are a known function of the observation, and checks
the chunks the actor streams against the requests it sent.
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from actors.env_ring import ChunkBuilder, EnvSplit, StepResult
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.stream_table import STATS
from srl_jax.wire.streams import RejectCounter, receive, send
from tests.conftest import make_config, write_run_dir
from tests.fakes import FakeServerAndLearner

# --------------------------------------------------------------------------- EnvSplit


def cartpole(limit: int | None) -> gym.Env:
    kwargs = {} if limit is None else {"max_episode_steps": limit}
    return gym.make("CartPole-v1", **kwargs)


def test_env_split_truncation_keeps_final_obs_and_resets():
    seeds = [11, 12, 13]
    split = EnvSplit([cartpole(5), cartpole(7), cartpole(5)], seeds)
    # Twins stepped by hand: the oracle for what each env returns.
    twins = [cartpole(5), cartpole(7), cartpole(5)]
    first = np.stack([twin.reset(seed=s)[0] for twin, s in zip(twins, seeds, strict=True)])
    np.testing.assert_array_equal(split.obs, first)
    assert len(split) == 3

    actions = np.array([1, 0, 1])  # alternate below so nothing terminates within 7 steps
    for step in range(1, 8):
        actions = 1 - actions
        result = split.step(actions)
        expected = [twin.step(int(a)) for twin, a in zip(twins, actions, strict=True)]
        np.testing.assert_array_equal(result.rewards, np.ones(3, np.float32))
        assert result.rewards.dtype == np.float32
        assert not result.terminated.any()
        ended = {5: [0, 2], 7: [1]}.get(step, [])
        np.testing.assert_array_equal(result.truncated, np.isin(np.arange(3), ended))
        assert result.truncated.dtype == bool and result.terminated.dtype == bool
        np.testing.assert_array_equal(result.truncated_envs, ended)
        assert result.final_obs.shape == (len(ended), 4)
        assert result.final_obs.dtype == np.float32
        for row, i in enumerate(ended):
            # The final observation is the one the env returned on its last step...
            np.testing.assert_array_equal(result.final_obs[row], expected[i][0])
            assert expected[i][3] and not expected[i][2]
            # ...and the next observation is the first of a fresh episode.
            fresh, _ = twins[i].reset()
            np.testing.assert_array_equal(result.next_obs[i], fresh)
            assert not np.array_equal(result.next_obs[i], result.final_obs[row])
        for i in set(range(3)) - set(ended):
            np.testing.assert_array_equal(result.next_obs[i], expected[i][0])
        np.testing.assert_array_equal(split.obs, result.next_obs)
        assert result.episode_returns == [float(step)] * len(ended)
        assert result.episode_lengths == [step] * len(ended)
    # Env 0 restarted at step 5, so two more steps in it is an episode of length 2 so far.
    assert split.lengths.tolist() == [2, 0, 2]
    split.close()


def steps_to_terminate(seed: int) -> int:
    env = cartpole(None)
    env.reset(seed=seed)
    for step in range(1, 100):
        if env.step(0)[2]:
            return step
    raise AssertionError("pushing left should end CartPole quickly")


def test_env_split_termination_has_no_final_obs():
    limit_at_end = steps_to_terminate(21)
    assert 5 <= limit_at_end < 30
    # env 0: no time limit; env 1: the time limit falls on the terminating step, where
    # gymnasium reports both flags: a terminal state wins, and nothing is bootstrapped.
    split = EnvSplit([cartpole(None), cartpole(limit_at_end)], [21, 21])
    for step in range(1, limit_at_end + 1):
        result = split.step(np.zeros(2, np.int64))
        if step < limit_at_end:
            assert not result.terminated.any() and not result.truncated.any()
            assert result.episode_returns == []
    np.testing.assert_array_equal(result.terminated, [True, True])
    np.testing.assert_array_equal(result.truncated, [False, False])
    assert result.truncated_envs.shape == (0,)
    assert result.final_obs.shape == (0, 4) and result.final_obs.dtype == np.float32
    np.testing.assert_array_equal(result.rewards, [1.0, 1.0])
    assert result.episode_returns == [float(limit_at_end)] * 2
    assert result.episode_lengths == [limit_at_end] * 2
    # Both envs were reset: a new episode starts upright (|x|, |theta| within 0.05).
    assert np.all(np.abs(result.next_obs) <= 0.05)
    assert split.lengths.tolist() == [0, 0] and split.returns.tolist() == [0.0, 0.0]
    split.close()


# --------------------------------------------------------------------------- ChunkBuilder


SCRIPTED_SPEC = EnvSpec((3,), np.dtype(np.float32), 2, continuous=False, state_size=2)


def scripted_obs(step: int, n: int = 2) -> np.ndarray:
    """Observation of env i at step s: [s, i, s * 10 + i] (float32, unique per row)."""
    return np.array([[step, i, step * 10 + i] for i in range(n)], np.float32)


def value_of(obs: np.ndarray) -> np.ndarray:
    return (obs[:, 0] * 10 + obs[:, 1] + 0.5).astype(np.float32)


def scripted_state(step: int, n: int = 2) -> np.ndarray:
    """The recurrent state a policy acts from at `step`: distinct per step and column."""
    return np.array([[step, -i] for i in range(n)], np.float32)


def test_chunk_builder_shapes_overlap_versions_and_trunc_values():
    T, n = 3, 2
    builder = ChunkBuilder(T, scripted_obs(0), dataclasses.replace(SCRIPTED_SPEC, final_obs=True))
    # Truncations: env 1 at step 1 (mid-chunk); env 0 at step 2, the last step of chunk 0,
    # whose bootstrap value only arrives with the answer that completes the chunk;
    # env 1 terminates at step 4.
    truncate_at = {1: [1], 2: [0], 7: [0, 1]}
    final_obs = {s: scripted_obs(100 + s)[envs] for s, envs in truncate_at.items()}
    chunks, pending = [], (np.empty(0, np.int64), np.empty((0, 3), np.float32))
    for step in range(10):
        obs = scripted_obs(step)
        request = np.concatenate([obs, pending[1]])  # what the actor would send
        values = value_of(request)
        done = builder.on_policy(np.array([step % 2, 1 - step % 2]),
                                 np.full(n, -0.1 * step, np.float32), values[:n],
                                 step // 2, values[n:], scripted_state(step))
        if done is not None:
            chunks.append((step, {k: v.copy() for k, v in done.items()}, done))
        envs = truncate_at.get(step, [])
        truncated = np.isin(np.arange(n), envs)
        terminated = np.array([False, step == 4])
        builder.on_step(StepResult(
            rewards=np.full(n, 1.0 + step, np.float32), terminated=terminated,
            truncated=truncated, next_obs=scripted_obs(step + 1),
            truncated_envs=np.asarray(envs, np.int64),
            final_obs=final_obs.get(step, np.empty((0, 3), np.float32))))
        pending = (np.asarray(envs, np.int64), final_obs.get(step, np.empty((0, 3), np.float32)))

    # A chunk is complete when the answer for its bootstrap observation arrives.
    assert [step for step, _, _ in chunks] == [3, 6, 9]
    for k, (_, chunk, live) in enumerate(chunks):
        # Later steps must not write into a chunk that was handed out.
        for key in chunk:
            np.testing.assert_array_equal(live[key], chunk[key], err_msg=key)
        expected = {
            "obs": ((T + 1, n, 3), np.float32), "values": ((T + 1, n), np.float32),
            "actions": ((T, n), np.int32), "logp": ((T, n), np.float32),
            "rewards": ((T, n), np.float32), "terminated": ((T, n), bool),
            "truncated": ((T, n), bool), "trunc_values": ((T, n), np.float32),
            "versions": ((T, n), np.int32), "state": ((1, n, 2), np.float32),
            "active": ((T, n), bool), "action_mask": ((T, n, 0), bool),
            "global_state": ((T + 1, n, 0), np.float32),
            "trunc_global_state": ((T, n, 0), np.float32),
            "priorities": ((T, n, 0), np.float32), "final_obs": ((T, n, 3), np.float32),
            "search_policy": ((T, n, 0), np.float32),
        }
        assert set(chunk) == set(expected)
        for key, (shape, dtype) in expected.items():
            assert chunk[key].shape == shape, key
            assert chunk[key].dtype == dtype, key
        steps = np.arange(k * T, k * T + T)
        # The state the policy acted from at the chunk's first step (the previous one's last).
        np.testing.assert_array_equal(chunk["state"][0], scripted_state(k * T))
        for t in range(T + 1):
            np.testing.assert_array_equal(chunk["obs"][t], scripted_obs(k * T + t))
            np.testing.assert_array_equal(chunk["values"][t], value_of(scripted_obs(k * T + t)))
        np.testing.assert_array_equal(chunk["actions"][:, 0], steps % 2)
        np.testing.assert_array_equal(chunk["logp"][:, 1], (-0.1 * steps).astype(np.float32))
        np.testing.assert_array_equal(chunk["rewards"][:, 0], 1.0 + steps)
        np.testing.assert_array_equal(chunk["versions"], np.repeat(steps // 2, n).reshape(T, n))
        np.testing.assert_array_equal(chunk["terminated"][:, 1], steps == 4)
        assert not chunk["terminated"][:, 0].any()
        for t, step in enumerate(steps):
            envs = truncate_at.get(step, [])
            np.testing.assert_array_equal(chunk["truncated"][t], np.isin(np.arange(n), envs))
            want = np.zeros(n, np.float32)
            want[envs] = value_of(final_obs[step]) if envs else []
            np.testing.assert_array_equal(chunk["trunc_values"][t], want, err_msg=f"step {step}")
            if envs:  # for a replay learner's target network
                np.testing.assert_array_equal(chunk["final_obs"][t, envs], final_obs[step])
    # The overlap: chunk k+1 starts where chunk k ended, with the same bootstrap value.
    for (_, a, _), (_, b, _) in itertools.pairwise(chunks):
        np.testing.assert_array_equal(a["obs"][T], b["obs"][0])
        np.testing.assert_array_equal(a["values"][T], b["values"][0])
    # Spot checks written out: env 1's truncation at step 1 and env 0's at step 2.
    assert chunks[0][1]["trunc_values"][1, 1] == value_of(scripted_obs(101))[1]
    assert chunks[0][1]["trunc_values"][2, 0] == value_of(scripted_obs(102))[0]
    assert chunks[0][1]["trunc_values"][2, 1] == 0.0


# --------------------------------------------------------------------------- actor process

N_ENVS, SPLITS, T, LIMIT = 4, 2, 8, 10
N = N_ENVS // SPLITS
CHUNKS_PER_SPLIT = 4
VERSION_EVERY = 3



def test_chunks_overlap_by_the_burn_in_so_every_step_enters_a_loss_once():
    """With burn-in K, each chunk after the first starts with the last K steps of the one
    before and the state the policy acted from at the first of them; the learner trains
    on steps K.. of each (all of the first chunk's, but its first K warm nothing), so
    every step is trained on once, against once per chunk less K before (chunks that
    only touched)."""
    T, K, n = 6, 2, 2
    builder = ChunkBuilder(T, scripted_obs(0), SCRIPTED_SPEC, overlap=K)
    chunks = []
    for step in range(30):
        values = value_of(scripted_obs(step))
        done = builder.on_policy(np.array([step % 2, 1 - step % 2]),
                                 np.full(n, -0.1 * step, np.float32), values, step,
                                 np.empty(0, np.float32), scripted_state(step))
        if done is not None:
            chunks.append({k: v.copy() for k, v in done.items()})
        builder.on_step(StepResult(
            rewards=np.full(n, float(step), np.float32), terminated=np.zeros(n, bool),
            truncated=np.zeros(n, bool), next_obs=scripted_obs(step + 1),
            truncated_envs=np.empty(0, np.int64), final_obs=np.empty((0, 3), np.float32)))
    assert len(chunks) == 6  # steps 0-5, then 4-9, 8-13, ... (T - K new steps each)
    for before, after in itertools.pairwise(chunks):
        for name in ("actions", "logp", "rewards", "versions", "terminated", "truncated"):
            np.testing.assert_array_equal(after[name][:K], before[name][T - K:], name)
        np.testing.assert_array_equal(after["obs"][:K + 1], before["obs"][T - K:])
        np.testing.assert_array_equal(after["values"][:K + 1], before["values"][T - K:])
        first = int(after["versions"][0, 0])  # the step number, as scripted
        np.testing.assert_array_equal(after["state"][0], scripted_state(first))
    trained = [int(v) for c, chunk in enumerate(chunks)
               for v in chunk["versions"][0 if c == 0 else K:, 0]]
    assert trained == list(range(len(trained))), "each step once, none lost"


def value_fn(obs: np.ndarray) -> np.ndarray:
    return (obs[:, 0] * np.float32(10) + np.float32(100)).astype(np.float32)


def policy(obs: np.ndarray) -> np.ndarray:
    """Env column 0 of each split always pushes right (terminates in ~9 steps, before the
    limit of 10); column 1 balances (truncated at 10). This desynchronizes the envs, so
    requests after a truncation carry one extra row, not a whole split's."""
    action = np.ones(len(obs), np.int32)
    action[1:N] = (obs[1:N, 2] + 0.5 * obs[1:N, 3] > 0).astype(np.int32)
    return action


class FakeInferenceAndLearner(FakeServerAndLearner):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.requests: dict[int, list[dict]] = defaultdict(list)  # per split, in order

    def answer(self, routing, message) -> None:
        obs = message.arrays["obs"].copy()
        meta = message.meta
        version = self.replies // VERSION_EVERY
        self.replies += 1
        reply = {"action": policy(obs), "logp": np.full(len(obs), -0.5, np.float32),
                 "value": value_fn(obs)}
        self.requests[meta["split"]].append(
            {"seq": meta["seq"], "obs": obs, "version": version, **reply})
        send(self.router, "infer_reply",
             {"split": meta["split"], "seq": meta["seq"], "version": version},
             reply, routing=routing)

def all_splits_chunked(fake: FakeInferenceAndLearner) -> bool:
    """Enough chunks, and every split has answered requests for its share of them."""
    return len(fake.chunks) >= SPLITS * CHUNKS_PER_SPLIT and len(fake.requests) == SPLITS and all(
        len(requests) > CHUNKS_PER_SPLIT * T for requests in fake.requests.values())


@pytest.mark.slow
def test_actor_process_streams_consistent_chunks(tmp_path, processes, stats_socket):
    run_dir = write_run_dir(tmp_path / "run", make_config([
        "actors.count=1", f"actors.envs={N_ENVS}", f"actors.splits={SPLITS}",
        f"actors.trajectory_length={T}", "actors.inference_timeout_s=60",
        "inference.count=1", f"env.kwargs={{max_episode_steps: {LIMIT}}}",
    ]))
    fake = FakeInferenceAndLearner(run_dir)
    try:
        actor = processes.worker("actor", 0, run_dir)
        fake.serve(lambda: all_splits_chunked(fake) or actor.poll() is not None, timeout=30)
        assert actor.poll() is None, (run_dir / "logs" / "actor-0.log").read_text()
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=15) == 0
    finally:
        fake.close()
    assert fake.rejects.count == 0
    assert all(meta.keys() == {"actor", "episode_returns"} and meta["actor"] == 0
               for meta in fake.chunk_meta)
    # Each chunk carries the returns of episodes finished since the previous one: CartPole
    # pays 1 per step, so a return is an episode length, at most LIMIT.
    returns = [r for meta in fake.chunk_meta for r in meta["episode_returns"]]
    ends = sum(int((c["terminated"] | c["truncated"]).sum()) for c in fake.chunks)
    assert returns and all(r == int(r) and 1 <= r <= LIMIT for r in returns)
    assert ends - N_ENVS <= len(returns) <= ends + N_ENVS

    # Requests: seq counts up by one per request of a split (the first may come with a
    # later seq: a request sent before the actor's socket connects is sent again).
    for requests in fake.requests.values():
        seqs = [r["seq"] for r in requests]
        assert seqs[0] >= 1 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert requests[0]["obs"].shape == (N, 4) and requests[0]["obs"].dtype == np.float32

    # Assign each chunk to its split and position: its first observation is the
    # first N rows of the request it started at; chunk c of a split starts at request c*T.
    per_split: dict[int, list[dict]] = defaultdict(list)
    for chunk in fake.chunks:
        owners = [s for s, reqs in fake.requests.items()
                  if len(reqs) > len(per_split[s]) * T and
                  np.array_equal(reqs[len(per_split[s]) * T]["obs"][:N], chunk["obs"][0])]
        assert len(owners) == 1, "each chunk continues exactly one split"
        per_split[owners[0]].append(chunk)
    assert sorted(per_split) == list(range(SPLITS))
    assert sum(len(c) for c in per_split.values()) == len(fake.chunks)

    truncations = terminations = partial = 0
    for split, chunks in per_split.items():
        requests = fake.requests[split]
        # Episode step counters per env, followed over the split's whole stream.
        lengths = np.zeros(N, np.int64)
        for c, chunk in enumerate(chunks):
            shapes = {"obs": ((T + 1, N, 4), np.float32), "values": ((T + 1, N), np.float32),
                      "actions": ((T, N), np.int32), "logp": ((T, N), np.float32),
                      "rewards": ((T, N), np.float32), "terminated": ((T, N), bool),
                      "truncated": ((T, N), bool), "trunc_values": ((T, N), np.float32),
                      "versions": ((T, N), np.int32), "state": ((1, N, 0), np.float32),
                      "active": ((T, N), bool), "action_mask": ((T, N, 0), bool),
                      "global_state": ((T + 1, N, 0), np.float32),
                      "trunc_global_state": ((T, N, 0), np.float32),
                      "priorities": ((T, N, 0), np.float32),
                      "final_obs": ((T, N, 0), np.float32),
                      "search_policy": ((T, N, 0), np.float32)}
            assert set(chunk) == set(shapes)
            for key, (shape, dtype) in shapes.items():
                assert chunk[key].shape == shape and chunk[key].dtype == dtype, key
            np.testing.assert_array_equal(chunk["rewards"], 1.0)
            assert not (chunk["terminated"] & chunk["truncated"]).any()
            if c > 0:  # consecutive chunks overlap by one observation
                np.testing.assert_array_equal(chunks[c - 1]["obs"][T], chunk["obs"][0])
                np.testing.assert_array_equal(chunks[c - 1]["values"][T], chunk["values"][0])
            for t in range(T + 1):
                request = requests[c * T + t]
                np.testing.assert_array_equal(chunk["obs"][t], request["obs"][:N])
                np.testing.assert_array_equal(chunk["values"][t], value_fn(chunk["obs"][t]))
            for t in range(T):
                request, following = requests[c * T + t], requests[c * T + t + 1]
                np.testing.assert_array_equal(chunk["versions"][t], request["version"])
                np.testing.assert_array_equal(chunk["actions"][t], request["action"][:N])
                np.testing.assert_array_equal(chunk["logp"][t], -0.5)
                lengths += 1
                ended = chunk["terminated"][t] | chunk["truncated"][t]
                # A time limit cuts exactly the episodes that reached it without falling.
                np.testing.assert_array_equal(
                    chunk["truncated"][t], (lengths == LIMIT) & ~chunk["terminated"][t])
                assert (lengths <= LIMIT).all()
                cut = np.flatnonzero(chunk["truncated"][t])
                # The request after the step carries one extra row per truncated env: its
                # final observation, whose value is the truncation's bootstrap value.
                assert len(following["obs"]) == N + len(cut)
                extra = following["obs"][N:]
                np.testing.assert_array_equal(chunk["trunc_values"][t, cut], value_fn(extra))
                np.testing.assert_array_equal(chunk["trunc_values"][t, ~chunk["truncated"][t]],
                                              0.0)
                # The final observation is not the reset one the chunk continues with.
                assert not np.array_equal(extra, chunk["obs"][t + 1][cut]) or not len(cut)
                truncations += len(cut)
                terminations += int(chunk["terminated"][t].sum())
                partial += int(0 < len(cut) < N)
                lengths[ended] = 0
    # The script above makes all three cases happen (the seeds are fixed by the config).
    assert truncations >= 2 and terminations >= 2 and partial >= 2, (
        truncations, terminations, partial)
    # Versions moved while the actor ran, so the per-step record is really per step.
    assert len({int(v) for chunk in fake.chunks for v in chunk["versions"].ravel()}) > 3

    # The heartbeats counted the frames stepped and reported finished episodes.
    counters, returns = {}, []
    while (got := receive(stats_socket, STATS.binder_receives, RejectCounter())) is not None:
        counters = got[1].meta["counters"]
        # The heartbeat sent before setup carries no episodes.
        returns.extend(got[1].arrays.get("episode_return", np.empty(0)).tolist())
    assert counters["env_frames"] >= SPLITS * CHUNKS_PER_SPLIT * T * N
    assert counters["chunks_sent"] >= SPLITS * CHUNKS_PER_SPLIT
    assert counters["infer_timeouts"] == 0
    assert returns and all(1 <= r <= LIMIT for r in returns)


class BadThenGoodReplies(FakeInferenceAndLearner):
    """Answers the first requests with malformed replies, then properly."""

    BAD = [
        lambda r: (dict(r["meta"], version=None), r["arrays"]),
        lambda r: (r["meta"], dict(r["arrays"], action=np.full_like(r["arrays"]["action"], 7))),
        lambda r: (r["meta"], dict(r["arrays"], value=r["arrays"]["value"][:1])),
        lambda r: (dict(r["meta"], split=99), r["arrays"]),
    ]

    def answer(self, routing, message) -> None:
        if self.replies >= len(self.BAD):
            return super().answer(routing, message)
        obs, meta = message.arrays["obs"], message.meta
        good = {"meta": {"split": meta["split"], "seq": meta["seq"], "version": 0},
                "arrays": {"action": policy(obs), "value": value_fn(obs),
                           "logp": np.full(len(obs), -0.5, np.float32)}}
        bad_meta, bad_arrays = self.BAD[self.replies](good)
        self.replies += 1
        send(self.router, "infer_reply", bad_meta, bad_arrays, routing=routing)


@pytest.mark.slow
def test_actor_survives_malformed_replies(tmp_path, processes, stats_socket):
    run_dir = write_run_dir(tmp_path / "run", make_config([
        "actors.count=1", f"actors.envs={N_ENVS}", f"actors.splits={SPLITS}",
        f"actors.trajectory_length={T}", "actors.inference_timeout_s=0.3",
        "inference.count=1", "runtime.stats_interval_s=0.1",
    ]))
    fake = BadThenGoodReplies(run_dir)
    try:
        actor = processes.worker("actor", 0, run_dir)
        fake.serve(lambda: len(fake.chunks) >= SPLITS or actor.poll() is not None, timeout=60)
        assert actor.poll() is None, (run_dir / "logs" / "actor-0.log").read_text()
    finally:
        fake.close()
    rejected = 0
    deadline = time.monotonic() + 10
    while rejected < len(BadThenGoodReplies.BAD) and time.monotonic() < deadline:
        if stats_socket.poll(100):
            got = receive(stats_socket, STATS.binder_receives, RejectCounter())
            rejected = max(rejected, got[1].meta["counters"]["wire_rejected"])
    assert rejected == len(BadThenGoodReplies.BAD)


def test_remote_mode_actor_never_imports_jax():
    code = ("import sys, actors.actor_worker, actors.env_ring, actors.envs\n"
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
