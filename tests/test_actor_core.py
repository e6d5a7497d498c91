"""The actor core on arrays: replies in, requests and chunks out, with no socket or process.

A scripted split stands for the env ring: env i's observation at step s is [s, i], and
env 0 is cut by a time limit every third step (its final observation [100 + s, 0]). The
test answers each request with values that are a known function of the observation.
"""

from __future__ import annotations

import numpy as np
import pytest

from actors.actor_core import ActionRequest, ActorCore, BadReply
from actors.env_ring import RingStep, StepResult
from srl_jax.dataflow.algorithms import chunk_stream
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.stream_table import INSERTS, SAMPLES
from srl_jax.dataflow.worker_kinds import load_worker_class
from tests.conftest import make_config

SPEC = EnvSpec((2,), np.dtype(np.float32), 3, continuous=False)
T, N = 3, 2
TRUNCATE_EVERY = 3


class ScriptedSplit:
    """`N` envs stepped by script, for every one of `policies` policies alike."""

    def __init__(self, policies: int = 1) -> None:
        self.t = 0
        self.policies = policies
        self.obs = [self._obs()] * policies
        self.masks = [None] * policies
        self.global_state = None
        self.actions: list[list] = []
        self.closed = False

    def _obs(self) -> np.ndarray:
        return np.array([[self.t, i] for i in range(N)], np.float32)

    def __len__(self) -> int:
        return N

    def step(self, actions: list[list]) -> RingStep:
        self.actions.append(actions)
        self.t += 1
        cut = [0] if self.t % TRUNCATE_EVERY == 0 else []
        returns, lengths = ([float(self.t)], [self.t]) if cut else ([], [])
        obs = self._obs()
        result = StepResult(np.ones(N, np.float32), np.zeros(N, bool), np.isin(np.arange(N), cut),
                            obs, np.asarray(cut, np.int64),
                            np.array([[100 + self.t, 0]], np.float32)[:len(cut)],
                            returns, lengths)
        self.obs = [obs] * self.policies
        return RingStep([result] * self.policies, returns, lengths)

    def close(self) -> None:
        self.closed = True


def value_of(obs: np.ndarray) -> np.ndarray:
    return (obs[:, 0] + 0.5).astype(np.float32)


def reply(request: ActionRequest, version: int = 0, action: int = 1
          ) -> tuple[dict, dict[str, np.ndarray]]:
    """An inference server's reply to `request`: `action` for every row, the value of its obs."""
    obs = request.arrays["obs"]
    return ({**request.meta, "version": version},
            {"action": np.full(len(obs), action, np.int32),
             "logp": np.full(len(obs), -1.0, np.float32),
             "value": value_of(obs)})


def test_replies_make_requests_and_overlapping_chunks_with_bootstrap_values():
    split = ScriptedSplit()
    core = ActorCore([split], ["default"], [SPEC], T)
    requests = core.start()
    assert [(r.split, r.policy, r.seq) for r in requests] == [(0, 0, 1)]
    chunks = []
    for step in range(2 * T + 1):
        request = requests[0]
        # After a truncation the request also asks for the final observation's value.
        cut = step > 0 and step % TRUNCATE_EVERY == 0
        assert len(request.arrays["obs"]) == N + cut
        assert set(request.arrays) == {"obs"}, "no state, mask or opponent for this policy"
        turn = core.on_reply(0, *reply(request, version=step))
        assert turn is not None, "one policy: every reply steps the split"
        chunks += turn.chunks
        requests = turn.requests
    assert [chunk.policy for chunk in chunks] == [0, 0]
    first, second = (chunk.arrays for chunk in chunks)
    assert first["obs"].shape == (T + 1, N, 2) and first["actions"].shape == (T, N)
    np.testing.assert_array_equal(first["obs"][:, 1, 0], np.arange(T + 1))
    np.testing.assert_array_equal(first["values"][:, 1], np.arange(T + 1) + 0.5)
    np.testing.assert_array_equal(first["versions"][:, 0], np.arange(T))
    np.testing.assert_array_equal(first["obs"][T], second["obs"][0])
    np.testing.assert_array_equal(first["values"][T], second["values"][0])
    # Env 0 was cut on step 3 (the last of the first chunk): its final observation's value
    # came with the reply that completed the chunk.
    np.testing.assert_array_equal(first["truncated"][:, 0], [False, False, True])
    np.testing.assert_array_equal(first["trunc_values"][:, 0], [0.0, 0.0, 103.5])
    assert not first["truncated"][:, 1].any()
    assert split.actions[0] == [[1, 1]]
    assert core.counters()["env_frames"] == (2 * T + 1) * N
    assert core.counters()["episodes"] == 2
    # Each chunk carries the returns of the episodes that ended since the one before.
    assert chunks[0].episode_returns == [3.0] and chunks[1].episode_returns == [6.0]
    arrays = core.episode_arrays()
    np.testing.assert_array_equal(arrays["episode_return"], [3.0, 6.0])
    np.testing.assert_array_equal(arrays["episode_length"], [3, 6])
    assert len(core.episode_arrays()["episode_return"]) == 0, "reported once"
    core.close()
    assert split.closed


def test_bad_and_late_replies():
    core = ActorCore([ScriptedSplit()], ["default"], [SPEC], T)
    (request,) = core.start()
    meta, arrays = reply(request)
    with pytest.raises(BadReply, match="unknown split"):
        core.on_reply(0, {**meta, "split": 5}, arrays)
    with pytest.raises(BadReply, match="outside the action space"):
        core.on_reply(0, *reply(request, action=3))
    with pytest.raises(BadReply, match="shapes"):
        core.on_reply(0, meta, {**arrays, "logp": arrays["logp"][:1]})
    with pytest.raises(BadReply, match="version"):
        core.on_reply(0, {**meta, "version": "1"}, arrays)
    assert core.on_reply(0, {**meta, "seq": 0}, arrays) is None, "an older request's reply"
    assert core.on_reply(0, meta, arrays) is not None, "the good reply still steps the split"


def test_unanswered_requests_are_asked_again_and_late_replies_ignored():
    core = ActorCore([ScriptedSplit(), ScriptedSplit()], ["default"], [SPEC], T,
                     resend_after_s=0.0)
    first = core.start()
    core.sent(first[0], delivered=True)
    core.sent(first[1], delivered=False)  # no server was connected
    assert core.oldest_pending() is not None
    again = core.overdue()
    assert [(r.split, r.seq) for r, _ in again] == [(0, 2), (1, 2)]
    assert again[0][1] is not None and again[1][1] is None, "only the delivered one waited"
    assert core.counters()["infer_timeouts"] == 1
    assert core.on_reply(0, *reply(first[0])) is None, "answers a request asked again"
    assert core.on_reply(0, *reply(again[0][0])) is not None
    np.testing.assert_array_equal(again[0][0].arrays["obs"], first[0].arrays["obs"])


def test_a_split_steps_once_every_policy_answered_and_frozen_ones_get_no_chunks():
    split = ScriptedSplit(policies=2)
    core = ActorCore([split], ["a", "b"], [SPEC, SPEC], T, frozen=("b",))
    requests = core.start()
    chunks = []
    for _ in range(T + 1):
        a, b = requests
        assert core.on_reply(0, *reply(a)) is None, "waits for policy b"
        turn = core.on_reply(1, *reply(b, action=0))
        chunks += turn.chunks
        requests = turn.requests
    assert split.actions[0] == [[1, 1], [0, 0]]
    assert [chunk.policy for chunk in chunks] == [0]
    # A frozen policy's requests never carry final observations: it is valued by no one.
    assert all(len(r.arrays["obs"]) == N for r in requests if r.policy == 1)


def test_epsilon_replaces_actions_at_each_columns_rate():
    split = ScriptedSplit()
    core = ActorCore([split], ["default"], [SPEC], T, epsilons=[[np.array([0.0, 1.0])]],
                     explore_rng=np.random.default_rng(0))
    (request,) = core.start()
    for _ in range(20):
        (request,) = core.on_reply(0, *reply(request, action=0)).requests
    taken = np.array([actions[0] for actions in split.actions])
    assert (taken[:, 0] == 0).all(), "epsilon 0: the policy's action"
    assert set(taken[:, 1]) == {0, 1, 2}, "epsilon 1: uniform over the actions"


def test_chunks_go_where_the_algorithms_declared_source_says():
    assert chunk_stream(make_config()) is SAMPLES
    replay = make_config(["learner.algorithm=dqn", "network.head=q", "replay.count=1"])
    assert chunk_stream(replay) is INSERTS


def test_inline_inference_runs_the_jax_side_actor_class():
    assert load_worker_class("actor", make_config()).__name__ == "ActorWorker"
    inline = load_worker_class("actor", make_config(["actors.inline_inference=true"]))
    assert inline.__name__ == "InlineActorWorker" and inline.kind == "actor"


def test_a_searching_policy_s_replies_carry_its_search_policy_into_the_chunks():
    searching = EnvSpec((2,), np.dtype(np.float32), 3, continuous=False, search_policy=True)
    core = ActorCore([ScriptedSplit()], ["default"], [searching], T)
    (request,) = core.start()
    meta, arrays = reply(request)
    with pytest.raises(BadReply, match="search policy"):
        core.on_reply(0, meta, arrays)
    uneven = np.full((N, 3), 0.5, np.float32)  # sums to 1.5
    with pytest.raises(BadReply, match="search policy"):
        core.on_reply(0, meta, {**arrays, "search_policy": uneven})
    chunks, requests = [], [request]
    for step in range(T + 1):  # the reply for the next chunk's first step completes one
        meta, arrays = reply(requests[0])
        rows = len(arrays["action"])
        policy = np.tile(np.array([0.1 * step, 0.0, 1 - 0.1 * step], np.float32), (rows, 1))
        turn = core.on_reply(0, meta, {**arrays, "search_policy": policy})
        chunks += turn.chunks
        requests = turn.requests
    (chunk,) = chunks
    assert chunk.arrays["search_policy"].shape == (T, N, 3)
    np.testing.assert_allclose(chunk.arrays["search_policy"][:, 0, 0], [0.0, 0.1, 0.2])
