"""Recurrent policies end to end: the state an actor carries, the chunks it streams and
the learner's unroll over them, burn-in, the inference server's checks of the state,
the trained policy's memory, the observation mask and the config checks.

The actor test plays the inference server and the learner for a real actor process,
answering with a real `PolicyRunner` of an LSTM policy, and checks every request and
chunk of one run against a step-by-step unroll of the same parameters done here.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import jax
import numpy as np
import pytest
import zmq

import tests.test_inference_server as inference_test
from actors.envs import make_env, policy_spec
from learners.algorithms.sequences import episode_starts
from learners.algorithms.train_state import Batch, init_train_state
from learners.models.networks import init_policy_params, make_policy
from policy.acting import make_runner
from policy.export import TrainedPolicy
from policy.policy_runner import PolicyRunner
from srl_jax.dataflow.algorithms import algorithm, algorithm_config, sizes
from srl_jax.dataflow.stream_table import PARAMS
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import make_socket, send
from srl_jax.wire.transport import Transport
from tests.conftest import Processes, make_config, wait_for, write_run_dir
from tests.fakes import FakeServerAndLearner
from tests.test_config import assert_launch_refuses
from tests.update_checks import single_agent_batch

CORE = ["network.core=lstm", "network.core_size=8", "network.hidden=[16]"]
S = 16
"""State width of the LSTM above: its cell and hidden vectors side by side."""

# --------------------------------------------------------------------------- actor process

N_ENVS, SPLITS, T, LIMIT = 4, 2, 8, 12
N = N_ENVS // SPLITS
CHUNKS_PER_SPLIT = 3
MASKED = [1, 3]


class RecurrentFake(FakeServerAndLearner):
    """Answers each request with a real runner of the policy, recording request and reply."""

    def __init__(self, run_dir: Path, runner: PolicyRunner) -> None:
        super().__init__(run_dir)
        self.runner = runner
        self.requests: dict[int, list[dict]] = defaultdict(list)  # per split, in order

    def answer(self, routing, message) -> None:
        obs, state = message.arrays["obs"].copy(), message.arrays["state"].copy()
        reply, version = self.runner.run(obs, state)
        self.replies += 1
        meta = message.meta
        self.requests[meta["split"]].append({"seq": meta["seq"], "obs": obs, "state": state,
                                             "new_state": reply["state"]})
        send(self.router, "infer_reply",
             {"split": meta["split"], "seq": meta["seq"], "version": version}, reply,
             routing=routing)


def ends_inside_chunks(chunks: list[dict]) -> tuple[int, int]:
    """(terminations, truncations) at steps whose next step is in the same chunk."""
    return (sum(int(c["terminated"][:T - 1].sum()) for c in chunks),
            sum(int(c["truncated"][:T - 1].sum()) for c in chunks))


def seen_enough(fake: RecurrentFake) -> bool:
    """Every split answered for its chunks, and both kinds of episode end happened inside one."""
    terminations, truncations = ends_inside_chunks(fake.chunks)
    return (len(fake.chunks) >= SPLITS * CHUNKS_PER_SPLIT and len(fake.requests) == SPLITS
            and all(len(r) > CHUNKS_PER_SPLIT * T for r in fake.requests.values())
            and terminations > 0 and truncations > 0)


def chunks_by_split(fake: RecurrentFake) -> dict[int, list[dict]]:
    """Each chunk at its place in its split: chunk c starts at the split's request c * T."""
    per_split: dict[int, list[dict]] = defaultdict(list)
    for chunk in fake.chunks:
        owners = [s for s, reqs in fake.requests.items()
                  if len(reqs) > len(per_split[s]) * T
                  and np.array_equal(reqs[len(per_split[s]) * T]["obs"][:N], chunk["obs"][0])]
        assert len(owners) == 1, "each chunk continues exactly one split"
        per_split[owners[0]].append(chunk)
    return per_split


@pytest.mark.slow
def test_actor_carries_the_lstm_state_its_chunks_store_and_the_learner_replays(
        tmp_path, processes, stats_socket):
    config = make_config([
        *CORE, "actors.count=1", f"actors.envs={N_ENVS}", f"actors.splits={SPLITS}",
        f"actors.trajectory_length={T}", "actors.inference_timeout_s=60", "inference.count=1",
        f"env.kwargs={{max_episode_steps: {LIMIT}}}", f"env.mask_obs={MASKED}"])
    run_dir = write_run_dir(tmp_path / "run", config)
    spec = policy_spec(config)
    assert spec.state_size == S
    runner = make_runner(config, spec, sampling_seed=5, min_size=1, max_size=2 * N)
    fake = RecurrentFake(run_dir, runner)
    try:
        actor = processes.worker("actor", 0, run_dir)
        fake.serve(lambda: seen_enough(fake) or actor.poll() is not None, timeout=60)
        assert actor.poll() is None, (run_dir / "logs" / "actor-0.log").read_text()
    finally:
        fake.close()
    assert fake.rejects.count == 0

    policy, network = make_policy(config, spec)
    params = init_policy_params(network, spec.obs_shape, config.seed)
    apply, unroll = jax.jit(policy.apply), jax.jit(policy.unroll)
    per_split = chunks_by_split(fake)
    assert sorted(per_split) == list(range(SPLITS))
    resets_after = {"terminated": 0, "truncated": 0}
    for split, chunks in per_split.items():
        requests = fake.requests[split]
        for request in requests:
            assert request["state"].shape == (len(request["obs"]), S)
            assert request["state"].dtype == np.float32
            assert not request["obs"][:, MASKED].any(), "env.mask_obs zeroes velocities"
        # (a) The state of every request is the local step-by-step unroll's; (b) zeroed
        # where the step before ended an episode; the final observations of truncated
        # episodes are valued with the state their episode ended in.
        state = np.zeros((N, S), np.float32)
        for k in range(len(chunks) * T):
            request, following = requests[k], requests[k + 1]
            chunk, t = chunks[k // T], k % T
            np.testing.assert_allclose(request["state"][:N], state, atol=1e-5, rtol=0,
                                       err_msg=f"split {split} step {k}")
            _, _, new_state = apply(params, request["obs"][:N], state)
            new_state = np.asarray(new_state)
            ended = chunk["terminated"][t] | chunk["truncated"][t]
            cut = np.flatnonzero(chunk["truncated"][t])
            assert len(following["obs"]) == N + len(cut)
            np.testing.assert_array_equal(following["state"][:N][ended], 0.0)
            np.testing.assert_array_equal(following["state"][:N][~ended],
                                          request["new_state"][:N][~ended])
            np.testing.assert_array_equal(following["state"][N:], request["new_state"][cut])
            np.testing.assert_allclose(following["state"][N:], new_state[cut], atol=1e-5,
                                       rtol=0)
            if len(cut):  # the bootstrap value comes from that episode's own state
                assert np.abs(following["state"][N:]).max(axis=1).min() > 0
                _, trunc_values, _ = apply(params, following["obs"][N:], new_state[cut])
                np.testing.assert_allclose(chunk["trunc_values"][t, cut], trunc_values,
                                           atol=1e-5, rtol=0)
            if t < T - 1:
                resets_after["terminated"] += int(chunk["terminated"][t].sum())
                resets_after["truncated"] += int(chunk["truncated"][t].sum())
            state = np.where(ended[:, None], 0.0, new_state).astype(np.float32)
        assert np.abs(requests[1]["state"]).max() > 0, "the state moves from step to step"

        for c, chunk in enumerate(chunks):
            # (c) A chunk stores the state its first step acted from.
            assert chunk["state"].shape == (1, N, S) and chunk["state"].dtype == np.float32
            np.testing.assert_array_equal(chunk["state"][0], requests[c * T]["state"][:N])
            # (d) The learner's unroll over the chunk from that state, restarting where an
            # episode ended, reproduces the acting policy's log-probabilities and values.
            resets = episode_starts(chunk["terminated"], chunk["truncated"], T + 1)
            out, values, _ = unroll(params, chunk["obs"], chunk["state"][0], resets)
            logp = policy.dist.log_prob(out[:T], chunk["actions"])
            np.testing.assert_allclose(logp, chunk["logp"], atol=1e-5, rtol=0)
            np.testing.assert_allclose(values, chunk["values"], atol=1e-5, rtol=0)
    # (b) Both kinds of episode end happened inside chunks, so both resets were checked.
    assert resets_after["terminated"] >= 1 and resets_after["truncated"] >= 1, resets_after


@pytest.mark.slow
def test_an_inline_actor_carries_the_state_the_learner_replays(tmp_path, processes,
                                                               stats_socket):
    """With inline inference the actor runs the LSTM itself: its chunks' stored states and
    acted log-probabilities and values are those of the learner's unroll of version 0
    (no learner publishes here; the actor builds version 0 from the seed)."""
    config = make_config([
        *CORE, "actors.count=1", f"actors.envs={N_ENVS}", f"actors.splits={SPLITS}",
        f"actors.trajectory_length={T}", "actors.inline_inference=true",
        f"env.kwargs={{max_episode_steps: {LIMIT}}}", f"env.mask_obs={MASKED}"])
    run_dir = write_run_dir(tmp_path / "run", config)
    params_socket = make_socket(zmq.Context.instance(), PARAMS.bind_type)
    Transport(zmq.Context.instance()).bind(params_socket, FileNameService(run_dir / "names"),
                                           PARAMS.key())
    fake = FakeServerAndLearner(run_dir)  # its learner's PULL; no request comes
    try:
        actor = processes.worker("actor", 0, run_dir)
        fake.serve(lambda: len(fake.chunks) >= SPLITS * CHUNKS_PER_SPLIT
                   or actor.poll() is not None, timeout=60)
        assert actor.poll() is None, (run_dir / "logs" / "actor-0.log").read_text()
    finally:
        fake.close()
        params_socket.close()
    assert fake.replies == 0 and fake.rejects.count == 0
    spec = policy_spec(config)
    policy, network = make_policy(config, spec)
    params = init_policy_params(network, spec.obs_shape, config.seed)
    unroll = jax.jit(policy.unroll)
    for chunk in fake.chunks:
        resets = episode_starts(chunk["terminated"], chunk["truncated"], T + 1)
        out, values, _ = unroll(params, chunk["obs"], chunk["state"][0], resets)
        logp = policy.dist.log_prob(out[:T], chunk["actions"])
        np.testing.assert_allclose(logp, chunk["logp"], atol=1e-5, rtol=0)
        np.testing.assert_allclose(values, chunk["values"], atol=1e-5, rtol=0)
    assert sum(np.abs(chunk["state"]).max() > 0 for chunk in fake.chunks) >= SPLITS, \
        "chunks after the first of each split start from a state the actor carried"


# --------------------------------------------------------------------------- burn-in

BURN_T, BURN_B, BURN_IN = 6, 4, 2


def burn_in_batch(seed: int = 0) -> Batch:
    """A [T+1, B] CartPole-shaped batch with a stored state and an episode end inside the
    burn-in (column 2, step 0) and after it (column 1, step 3)."""
    rng = np.random.default_rng(seed)
    terminated = np.zeros((BURN_T, BURN_B), np.float32)
    truncated = np.zeros((BURN_T, BURN_B), np.float32)
    terminated[3, 1] = truncated[0, 2] = 1.0
    return single_agent_batch(
        obs=rng.normal(size=(BURN_T + 1, BURN_B, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (BURN_T, BURN_B)).astype(np.int32),
        logp=np.log(rng.uniform(0.3, 0.7, (BURN_T, BURN_B))).astype(np.float32),
        values=rng.normal(size=(BURN_T + 1, BURN_B)).astype(np.float32),
        rewards=rng.normal(size=(BURN_T, BURN_B)).astype(np.float32),
        terminated=terminated, truncated=truncated,
        trunc_values=rng.normal(size=(BURN_T, BURN_B)).astype(np.float32),
        state=(0.5 * rng.normal(size=(1, BURN_B, S))).astype(np.float32))


def loss_and_derivative(algo: str, burn_in: int):
    """(batch, d_obs, d_state) -> (the update's loss, its derivative along the direction
    (d_obs, d_state) of the batch's observations and stored state), for `algo` with
    `learner.burn_in`: one epoch of one minibatch, so the loss is that of the initial
    parameters. (Forward mode: it compiles several times faster than a gradient taken
    through the update's own gradient, and a random direction finds any gradient.)"""
    config = make_config([
        *CORE, f"learner.algorithm={algo}", f"actors.trajectory_length={BURN_T}",
        f"learner.batch_envs={BURN_B}", f"learner.burn_in={burn_in}",
        "learner.normalize_obs=false", "learner.ppo.epochs=1", "learner.ppo.minibatches=1"])
    spec = policy_spec(config)
    policy, network = make_policy(config, spec)
    algo_config = algorithm_config(config)
    optimizer = algorithm(algo).make_optimizer(algo_config, sizes(config))
    update = algorithm(algo).make_update(policy, optimizer, algo_config, sizes(config))
    train_state = init_train_state(init_policy_params(network, spec.obs_shape, 3), optimizer, 3)

    @jax.jit
    def along(batch: Batch, d_obs: jax.Array, d_state: jax.Array) -> tuple:
        def loss(obs: jax.Array, state: jax.Array) -> jax.Array:
            return update(train_state, batch._replace(obs=obs, state=state))[1]["loss"]

        return jax.jvp(loss, (batch.obs, batch.state), (d_obs, d_state))

    return along


def directions(batch: Batch, steps: range, rng: np.random.Generator) -> tuple:
    """A random direction of the observations at `steps` only, none of the state."""
    d_obs = np.zeros_like(batch.obs)
    d_obs[steps] = rng.normal(size=d_obs[steps].shape)
    return d_obs, np.zeros_like(batch.state)


def with_first_steps(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """`x` with its first len(first) steps replaced by `first`."""
    return np.concatenate([first, np.asarray(x)[len(first):]]).astype(x.dtype)


def changed_in_first_steps(batch: Batch, steps: int) -> Batch:
    """`batch` with other actions, log-probabilities, values and rewards (so other
    advantages) at its first `steps` steps."""
    other = np.full((steps, BURN_B), -2.0, np.float32)
    return batch._replace(
        actions=with_first_steps(batch.actions, 1 - batch.actions[:steps]),
        logp=with_first_steps(batch.logp, other),
        values=with_first_steps(batch.values, other + 9.0),
        rewards=with_first_steps(batch.rewards, other - 3.0))


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_burn_in_steps_receive_no_gradient(algo: str) -> None:
    batch, rng = burn_in_batch(), np.random.default_rng(1)
    no_obs, no_state = np.zeros_like(batch.obs), np.zeros_like(batch.state)
    some_state = rng.normal(size=batch.state.shape).astype(np.float32)

    with_burn_in = loss_and_derivative(algo, BURN_IN)
    loss, slope = with_burn_in(batch, *directions(batch, range(BURN_IN), rng))
    assert np.isfinite(float(loss)) and float(slope) == 0.0
    assert float(with_burn_in(batch, no_obs, some_state)[1]) == 0.0
    for step in range(BURN_IN, BURN_T):
        assert float(with_burn_in(batch, *directions(batch, range(step, step + 1), rng))[1]), step
    # What the burn-in steps did (their actions, log-probabilities, advantages) is no
    # part of the loss; their observations still warm the state it starts from.
    changed = changed_in_first_steps(batch, BURN_IN)
    assert float(with_burn_in(changed, no_obs, no_state)[0]) == float(loss)
    warmed = batch._replace(obs=with_first_steps(batch.obs, batch.obs[:BURN_IN] + 0.5))
    assert float(with_burn_in(warmed, no_obs, no_state)[0]) != float(loss)

    # Without burn-in the same checks fail: every step and the stored state get gradient.
    without = loss_and_derivative(algo, 0)
    loss = float(without(batch, no_obs, no_state)[0])
    for step in range(BURN_T):
        assert float(without(batch, *directions(batch, range(step, step + 1), rng))[1]), step
    assert float(without(batch, no_obs, some_state)[1])
    assert float(without(changed, no_obs, no_state)[0]) != loss


# --------------------------------------------------------------------------- inference server


@pytest.mark.slow
def test_inference_server_drops_requests_with_a_bad_state_and_keeps_serving(
        tmp_path, processes: Processes, stats_socket: zmq.Socket) -> None:
    """tests/test_inference_server.py's server process and actor stand-ins, with an LSTM
    policy (and one padded size, 4 rows, to compile)."""
    server = inference_test.Server(tmp_path, processes, stats_socket, (
        *CORE, "inference.max_batch=4", "inference.min_padded_batch=4",
        "runtime.stats_interval_s=0.1"))
    try:
        spec = policy_spec(server.config)
        policy, network = make_policy(server.config, spec)
        params = init_policy_params(network, spec.obs_shape, server.config.seed)
        rng = np.random.default_rng(0)
        client = server.dealer()
        obs = inference_test.observations(3, rng)
        state = rng.normal(size=(3, S)).astype(np.float32)
        _, values, new_state = policy.apply(params, obs, state)

        def check_answer(seq: int, timeout_s: float = inference_test.REPLY_TIMEOUT_S) -> None:
            reply = server.reply(client, timeout_s)
            inference_test.check_reply(reply, seq, obs, 0)
            assert reply.arrays["state"].shape == (3, S)
            assert reply.arrays["state"].dtype == np.float32
            np.testing.assert_allclose(reply.arrays["state"], new_state, atol=1e-5, rtol=0)
            np.testing.assert_allclose(reply.arrays["value"], values, atol=1e-5, rtol=0)

        good = {"obs": obs, "state": state}
        send(client, "infer_request", {"split": 0, "seq": 1}, good)
        server.publish_until_answered(params, client)
        check_answer(1)

        before = wait_for(server.latest_counters, 10, "a heartbeat")["wire_rejected"]
        bad_states = [state[:, :-1], state[:2], state.astype(np.float64), None]
        for seq, bad in enumerate(bad_states, start=10):
            arrays = {"obs": obs} if bad is None else {"obs": obs, "state": bad}
            send(client, "infer_request", {"split": 0, "seq": seq}, arrays)
        send(client, "infer_request", {"split": 0, "seq": 2}, good)
        check_answer(2)  # the reply to the good request behind them is the next reply
        assert not client.poll(200), "a request with a bad state got a reply"
        assert server.process.poll() is None, server.log_tail()

        def rejected_all() -> bool:
            counters = server.latest_counters()
            return counters is not None and counters["wire_rejected"] - before == len(bad_states)

        wait_for(rejected_all, 10, f"wire_rejected to grow by {len(bad_states)}")
    finally:
        server.close()


# --------------------------------------------------------------------------- unit checks


def test_mask_obs_zeroes_the_entries_it_names() -> None:
    plain = make_env(make_config().env)
    masked = make_env(make_config([f"env.mask_obs={MASKED}"]).env)
    np.testing.assert_array_equal(masked.observation_space.low[MASKED], 0.0)
    np.testing.assert_array_equal(masked.observation_space.high[MASKED], 0.0)
    keep = [0, 2]
    obs, masked_obs = plain.reset(seed=4)[0], masked.reset(seed=4)[0]
    for action in (1, 1, 0, 1):
        assert masked.observation_space.contains(masked_obs)
        np.testing.assert_array_equal(masked_obs[MASKED], 0.0)
        np.testing.assert_array_equal(masked_obs[keep], obs[keep])
        assert np.abs(obs[MASKED]).min() > 0, "the velocities were there to mask"
        obs, masked_obs = plain.step(action)[0], masked.step(action)[0]


@pytest.mark.parametrize("overrides, fragment", [
    (["learner.burn_in=4"], "'learner.burn_in' warms a recurrent state: it needs 'network.core'"),
    (["network.core=rnn"], "'network.core': unknown 'rnn' (known: none, lstm, gru)"),
    (["network.core=lstm", "actors.trajectory_length=32", "learner.burn_in=17"],
     "'learner.burn_in' (17) must be at most half of 'actors.trajectory_length' (32)"),
    (["network.core=lstm", "learner.ppo.minibatches=64"],
     "'learner.ppo.minibatches' (64) must divide 'learner.batch_envs' (32): a recurrent "
     "policy's minibatches are whole env columns"),
    (["env.mask_obs=[2, 4]"], "'env.mask_obs': [4] are not indices of the 4 observation"),
])
def test_recurrent_config_errors_are_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        overrides: list[str], fragment: str) -> None:
    """As tests/test_config.py checks the other keys: `main` in this process, exit code 2,
    one line naming the key, nothing started."""
    monkeypatch.chdir(tmp_path)
    args = ["cartpole_ppo"]
    for override in overrides:
        args += ["--set", override]
    assert_launch_refuses(args, fragment, tmp_path / "run", capsys)


@pytest.mark.parametrize("core, width", [("lstm", 16), ("gru", 8)])
def test_trained_policy_keeps_its_state_between_calls_and_resets(core: str, width: int) -> None:
    config = make_config([*CORE, f"network.core={core}"])
    spec = policy_spec(config)
    assert spec.state_size == width
    policy, network = make_policy(config, spec)
    params = init_policy_params(network, spec.obs_shape, 7)
    trained = TrainedPolicy(config, spec, policy, params, step=0)
    rng = np.random.default_rng(1)
    steps = rng.normal(size=(2, 4)).astype(np.float32)
    apply = jax.jit(policy.apply)

    expected = np.zeros((1, width), np.float32)
    for obs in steps:  # the state after each call is the one the next call acts from
        trained.act(obs)
        expected = np.asarray(apply(params, obs[None], expected)[2])
        assert trained.state.shape == (1, width) and trained.state.dtype == np.float32
        np.testing.assert_allclose(trained.state, expected, atol=1e-6, rtol=0)
    assert np.abs(trained.state).max() > 0
    remembered = trained.state.copy()

    trained.reset()  # a new episode acts from zeros again
    trained.act(steps[0])
    first = np.asarray(apply(params, steps[:1], np.zeros((1, width), np.float32))[2])
    np.testing.assert_allclose(trained.state, first, atol=1e-6, rtol=0)
    assert not np.allclose(first, remembered)

    # In a batch, `reset(rows)` starts new episodes in those rows only.
    batch = np.stack([steps[0], steps[1]])
    trained.act_batch(batch)
    trained.act_batch(batch)
    kept = trained.state[1].copy()
    assert np.abs(kept).max() > 0
    trained.reset(np.array([True, False]))
    np.testing.assert_array_equal(trained.state[0], 0.0)
    np.testing.assert_array_equal(trained.state[1], kept)
