"""Continuous actions: the Gaussian by closed form, observation statistics, normalization,
and a real actor on Pendulum-v1 that stores sampled actions but steps its envs with clipped ones.

The actor tests play the inference server and the learner as tests/test_actor_ring.py
does. One of them runs a probe environment defined here (the actor imports this module
through gymnasium's "module:EnvId" form) whose observation echoes the action it was
stepped with, so the test sees exactly what the environment received.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actors.envs import env_seed, env_spec
from learners.algorithms.ppo import make_optimizer, make_update
from learners.algorithms.prepare import prepare
from learners.algorithms.train_state import Batch, init_train_state
from learners.models.distributions import CATEGORICAL, GAUSSIAN, distribution
from learners.models.networks import OBS_CLIP, init_policy_params, make_policy, update_obs_stats
from srl_jax.config.loader import load_config
from srl_jax.config.schema import EnvConfig
from srl_jax.dataflow.algorithms import algorithm_config, sizes
from srl_jax.dataflow.stream_table import STATS
from srl_jax.wire.streams import RejectCounter, receive, send
from tests.conftest import REPO, make_config, stop_when, write_run_dir
from tests.fakes import FakeServerAndLearner
from tests.update_checks import single_agent_batch

LOG_2PI = math.log(2 * math.pi)

# --------------------------------------------------------------------------- Gaussian


def gaussian_case(rng: np.random.Generator, n: int, dim: int) -> tuple:
    mean = rng.normal(0.0, 2.0, (n, dim))
    log_std = rng.uniform(-2.0, 1.0, (n, dim))
    actions = mean + np.exp(log_std) * rng.normal(0.0, 1.5, (n, dim))
    out = np.concatenate([mean, log_std], -1).astype(np.float32)
    return out, mean, log_std, actions.astype(np.float32)


@pytest.mark.parametrize("dim", [1, 2, 3, 6])
def test_gaussian_log_prob_and_entropy_match_closed_form(dim):
    out, mean, log_std, actions = gaussian_case(np.random.default_rng(dim), 16, dim)
    std = np.exp(log_std)
    a = actions.astype(np.float64)
    # The product of the per-dimension densities 1/(s sqrt(2 pi)) exp(-(a - m)^2 / (2 s^2)).
    density = np.prod(np.exp(-((a - mean) ** 2) / (2 * std**2)) / (std * np.sqrt(2 * np.pi)), -1)
    expanded = (-0.5 * np.sum(((a - mean) / std) ** 2, -1) - np.sum(log_std, -1)
                - 0.5 * dim * LOG_2PI)
    np.testing.assert_allclose(np.log(density), expanded, rtol=1e-10)
    log_prob = np.asarray(GAUSSIAN.log_prob(jnp.asarray(out), jnp.asarray(actions)))
    assert log_prob.shape == (16,) and log_prob.dtype == np.float32
    np.testing.assert_allclose(log_prob, expanded, rtol=1e-5, atol=1e-4)

    # Differential entropy of a diagonal Gaussian: sum(log s) + d/2 (1 + log 2 pi).
    entropy = np.asarray(GAUSSIAN.entropy(jnp.asarray(out)))
    assert entropy.shape == (16,)
    np.testing.assert_allclose(entropy, np.sum(log_std, -1) + 0.5 * dim * (1 + LOG_2PI),
                               rtol=1e-5, atol=1e-5)
    # ...which is also the expected negative log-density of its own samples.
    row = np.repeat(out[:1], 20_000, 0)
    samples = GAUSSIAN.sample(jax.random.key(dim), jnp.asarray(row))
    mc_entropy = -float(np.mean(np.asarray(GAUSSIAN.log_prob(jnp.asarray(row), samples))))
    assert abs(mc_entropy - float(entropy[0])) < 0.05 * math.sqrt(dim)


def test_gaussian_sample_statistics():
    dim, n = 3, 40_000
    mean = np.array([1.5, -3.0, 0.0], np.float32)
    log_std = np.log(np.array([0.2, 1.0, 2.5], np.float32))
    out = np.tile(np.concatenate([mean, log_std]), (n, 1))
    samples = np.asarray(GAUSSIAN.sample(jax.random.key(7), jnp.asarray(out)))
    assert samples.shape == (n, dim) and samples.dtype == np.float32
    std = np.exp(log_std)
    # Sample mean within 5 standard errors, sample std within 3%.
    assert np.all(np.abs(samples.mean(0) - mean) < 5 * std / np.sqrt(n))
    np.testing.assert_allclose(samples.std(0), std, rtol=0.03)
    # Dimensions are sampled independently.
    corr = np.corrcoef(samples.T)
    assert np.all(np.abs(corr - np.eye(dim)) < 0.03)
    # Different keys give different samples; the same key the same ones.
    again = np.asarray(GAUSSIAN.sample(jax.random.key(7), jnp.asarray(out)))
    other = np.asarray(GAUSSIAN.sample(jax.random.key(8), jnp.asarray(out)))
    np.testing.assert_array_equal(samples, again)
    assert not np.allclose(samples, other)


def test_distribution_picks_by_action_space():
    assert distribution(True) is GAUSSIAN
    assert distribution(False) is CATEGORICAL


# --------------------------------------------------------------------------- obs statistics


def test_update_obs_stats_merges_batches_like_numpy_over_the_concatenation():
    rng = np.random.default_rng(3)
    shape = (3,)
    params = {"net": {"w": jnp.ones(2)}, "obs_mean": jnp.zeros(shape, jnp.float32),
              "obs_var": jnp.ones(shape, jnp.float32), "obs_count": jnp.zeros((), jnp.float32)}
    scale = np.array([0.5, 3.0, 20.0])
    offset = np.array([5.0, -2.0, 100.0])
    batches = [
        rng.normal(size=(1, *shape)),  # a single row has no variance of its own
        rng.normal(size=(7, *shape)) * 2.0,
        rng.normal(size=(8, 25, *shape)),  # [T, B, ...] is flattened over T and B
        rng.normal(size=(3, *shape)) + 4.0,  # a shifted batch: the mean moves
        rng.normal(size=(200, *shape)),
    ]
    seen = []
    for batch in batches:
        batch = (batch * scale + offset).astype(np.float32)
        seen.append(batch.reshape(-1, *shape))
        params = update_obs_stats(params, jnp.asarray(batch))
        data = np.concatenate(seen).astype(np.float64)
        assert float(params["obs_count"]) == len(data)
        np.testing.assert_allclose(params["obs_mean"], data.mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(params["obs_var"], data.var(0), rtol=1e-4, atol=1e-6)
    assert params["obs_mean"].dtype == jnp.float32 and params["obs_var"].shape == shape
    np.testing.assert_array_equal(params["net"]["w"], np.ones(2))


def test_update_obs_stats_of_image_shaped_observations():
    rng = np.random.default_rng(4)
    shape = (2, 3)
    params = {"obs_mean": jnp.zeros(shape), "obs_var": jnp.ones(shape),
              "obs_count": jnp.zeros(())}
    a = rng.uniform(0, 255, (4, 5, *shape)).astype(np.float32)
    b = rng.uniform(0, 255, (9, *shape)).astype(np.float32)
    params = update_obs_stats(update_obs_stats(params, a), b)
    data = np.concatenate([a.reshape(-1, *shape), b]).astype(np.float64)
    np.testing.assert_allclose(params["obs_mean"], data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(params["obs_var"], data.var(0), rtol=1e-4)


# --------------------------------------------------------------------------- policy


def pendulum_config(*overrides: str):
    return make_config(["env.id=Pendulum-v1", *overrides])


def test_policy_normalizes_and_clips_observations():
    config = pendulum_config("learner.normalize_obs=true")
    spec = env_spec(config.env)
    assert spec.continuous and spec.action_dim == 1 and spec.obs_shape == (3,)
    assert spec.action_low == (-2.0,) and spec.action_high == (2.0,)
    policy, network = make_policy(config, spec)
    assert policy.normalize_obs and policy.dist is GAUSSIAN
    params = init_policy_params(network, spec.obs_shape, seed=0)
    mean = np.array([0.5, -1.0, 3.0], np.float32)
    var = np.array([0.25, 4.0, 1e-4], np.float32)
    params = {**params, "obs_mean": jnp.asarray(mean), "obs_var": jnp.asarray(var),
              "obs_count": jnp.asarray(100.0)}
    obs = np.array([[0.5, -1.0, 3.0],  # the mean itself: all zeros
                    [1.0, 3.0, 3.0005],  # (1, 2, ~0.05): inside the clip
                    [10.0, -50.0, 4.0],  # (19, -24.5, ~100): clipped to +-10
                    [-3.0, 30.0, -2.0]], np.float32)
    normalized = np.clip((obs - mean) / np.sqrt(var + 1e-8), -OBS_CLIP, OBS_CLIP)
    assert OBS_CLIP == 10.0
    assert (np.abs(normalized) == 10.0).sum() >= 5  # the clip really happens
    no_state = jnp.zeros((4, 0))
    out, value, _ = policy.apply(params, jnp.asarray(obs), no_state)
    want_out, want_value = network.apply(params["net"], jnp.asarray(normalized))
    assert out.shape == (4, 2) and value.shape == (4,)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-6)
    # Unclipped, the outputs differ: the clip is not a no-op for these rows.
    raw_out, _ = network.apply(params["net"], jnp.asarray((obs - mean) / np.sqrt(var + 1e-8)))
    assert not np.allclose(raw_out[2:, 0], want_out[2:, 0])
    # The log-std half is the state-independent parameter (zero at init).
    np.testing.assert_array_equal(out[:, 1], 0.0)

    plain, _ = make_policy(pendulum_config("learner.normalize_obs=false"), spec)
    assert not plain.normalize_obs
    out, value, _ = plain.apply(params, jnp.asarray(obs), no_state)
    want_out, want_value = network.apply(params["net"], jnp.asarray(obs))
    np.testing.assert_allclose(out, want_out, rtol=1e-6)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)


def continuous_batch(T: int, B: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    obs = rng.normal([0.0, 0.5, 2.0], [1.0, 0.3, 4.0], (T + 1, B, 3)).astype(np.float32)
    return single_agent_batch(obs=jnp.asarray(obs),
                 actions=jnp.asarray(rng.normal(0, 1.5, (T, B, 1)).astype(np.float32)),
                 logp=jnp.asarray(rng.normal(-1.3, 0.1, (T, B)).astype(np.float32)),
                 values=jnp.zeros((T + 1, B)),
                 rewards=jnp.asarray(rng.uniform(-16, 0, (T, B)).astype(np.float32)),
                 terminated=jnp.zeros((T, B)), truncated=jnp.zeros((T, B)),
                 trunc_values=jnp.zeros((T, B)), state=jnp.zeros((1, B, 0)))


def test_prepare_folds_the_acted_observations_and_scales_rewards():
    T, B = 8, 4
    batch = continuous_batch(T, B)
    acted = np.asarray(batch.obs[:-1], np.float64).reshape(-1, 3)
    for normalize in (True, False):
        config = pendulum_config(f"learner.normalize_obs={str(normalize).lower()}")
        spec = env_spec(config.env)
        policy, network = make_policy(config, spec)
        params = init_policy_params(network, spec.obs_shape, 0)
        new_params, scaled = prepare(params, batch, policy, 0.1, 0.0)
        np.testing.assert_allclose(scaled.rewards, np.asarray(batch.rewards) * 0.1, rtol=1e-6)
        np.testing.assert_array_equal(scaled.obs, batch.obs)
        if normalize:  # the T acted-on observations, not the bootstrap one
            assert float(new_params["obs_count"]) == T * B
            np.testing.assert_allclose(new_params["obs_mean"], acted.mean(0), rtol=1e-5,
                                       atol=1e-6)
            np.testing.assert_allclose(new_params["obs_var"], acted.var(0), rtol=1e-4)
        else:
            assert float(new_params["obs_count"]) == 0
            np.testing.assert_array_equal(new_params["obs_var"], 1.0)
    _, same = prepare(params, batch, policy, 1.0, 0.0)
    np.testing.assert_array_equal(same.rewards, batch.rewards)
    _, clipped = prepare(params, batch, policy, 2.0, 1.0)  # scaled first, then clipped
    np.testing.assert_allclose(clipped.rewards, np.clip(np.asarray(batch.rewards) * 2, -1, 1))
    assert float(np.abs(np.asarray(batch.rewards) * 2).max()) > 1, "the clip must bite"


def test_ppo_update_trains_a_gaussian_policy_with_normalization():
    T, B = 8, 4
    batch = continuous_batch(T, B)
    config = pendulum_config("learner.normalize_obs=true", "learner.reward_scale=0.1",
                             "learner.ppo.epochs=2", "learner.ppo.minibatches=1")
    spec = env_spec(config.env)
    policy, network = make_policy(config, spec)
    ppo, sz = algorithm_config(config), sizes(config)
    optimizer = make_optimizer(ppo, sz)
    state = init_train_state(init_policy_params(network, spec.obs_shape, 0), optimizer, 0)
    new_state, metrics = jax.jit(make_update(policy, optimizer, ppo, sz))(state, batch)
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
    assert float(metrics["epochs_run"]) == 2
    assert int(new_state.version) == 1
    # The published parameters carry the statistics of the batch...
    assert float(new_state.params["obs_count"]) == T * B
    # ...and the network, log-std included, moved.
    log_std = new_state.params["net"]["params"]["log_std"]
    assert log_std.shape == (1,)
    assert not np.allclose(log_std, state.params["net"]["params"]["log_std"])
    # With zero values, GAE's returns are linear in the (scaled) rewards.
    rewards = np.asarray(batch.rewards, np.float64) * 0.1
    returns = np.zeros_like(rewards)
    running = np.zeros(B)
    for t in reversed(range(T)):
        running = rewards[t] + ppo.gamma * ppo.gae_lambda * running
        returns[t] = running
    np.testing.assert_allclose(float(metrics["return_mean"]), returns.mean(), rtol=1e-4)


def test_pendulum_config_is_valid():
    config = load_config(REPO / "configs" / "pendulum_ppo.yaml")
    assert config.env.id == "Pendulum-v1" and config.learner.algorithm == "ppo"
    assert config.learner.normalize_obs and config.learner.reward_scale < 1.0
    assert config.stop.target_return == -250 and config.stop.wall_time_s == 600


# --------------------------------------------------------------------------- actor process

N_ENVS, SPLITS, T = 4, 2, 8
N = N_ENVS // SPLITS
CHUNKS_PER_SPLIT = 3


def value_fn(obs: np.ndarray) -> np.ndarray:
    return (obs[:, 0] * np.float32(10) + np.float32(100)).astype(np.float32)


class FakeServer(FakeServerAndLearner):
    """Plays the inference server and the learner; `actions(obs)` answers requests.

    The first `len(bad)` requests are answered twice: first with a reply spoiled by
    the function in `bad`, which the actor must reject, then with the proper one.
    """

    def __init__(self, run_dir: Path, actions, bad=()) -> None:
        super().__init__(run_dir)
        self.actions, self.bad = actions, list(bad)

    def answer(self, routing, message) -> None:
        obs, meta = message.arrays["obs"], message.meta
        reply = {"action": self.actions(obs), "logp": np.full(len(obs), -0.5, np.float32),
                 "value": value_fn(obs)}
        reply_meta = {"split": meta["split"], "seq": meta["seq"], "version": 0}
        if self.replies < len(self.bad):
            send(self.router, "infer_reply", reply_meta, self.bad[self.replies](reply),
                 routing=routing)
        self.replies += 1
        send(self.router, "infer_reply", reply_meta, reply, routing=routing)


def run_actor(tmp_path: Path, processes, fake_factory, overrides: list[str],
              chunks: int) -> tuple:
    config = make_config([
        "actors.count=1", f"actors.envs={N_ENVS}", f"actors.splits={SPLITS}",
        f"actors.trajectory_length={T}", "inference.count=1",
        "actors.inference_timeout_s=60", "runtime.stats_interval_s=0.1", *overrides,
    ])
    run_dir = write_run_dir(tmp_path / "run", config)
    fake = fake_factory(run_dir)
    try:
        actor = processes.worker("actor", 0, run_dir)
        fake.serve(lambda: len(fake.chunks) >= chunks or actor.poll() is not None, timeout=60)
        log = (run_dir / "logs" / "actor-0.log").read_text()
        assert actor.poll() is None, log
    finally:
        fake.close()
    return config, fake, actor, run_dir


def stop(actor, run_dir: Path) -> None:
    actor.send_signal(signal.SIGTERM)
    assert actor.wait(timeout=15) == 0, (run_dir / "logs" / "actor-0.log").read_text()


def pendulum_actions(obs: np.ndarray) -> np.ndarray:
    """5.0 (beyond Pendulum's bound of 2.0) everywhere but the second env of a split: 0.5."""
    action = np.full((len(obs), 1), 5.0, np.float32)
    action[1:N] = 0.5
    return action


BAD_REPLIES = [
    lambda r: dict(r, action=np.full_like(r["action"], np.nan)),
    lambda r: dict(r, action=np.where(np.arange(len(r["action"]))[:, None] == 0, -np.inf,
                                      r["action"]).astype(np.float32)),
    lambda r: dict(r, action=r["action"].astype(np.float64)),  # continuous means float32
    lambda r: dict(r, action=r["action"][:, 0]),  # [N] where [N, 1] is expected
]


@pytest.mark.slow
def test_actor_stores_sampled_actions_and_steps_pendulum_with_clipped_ones(
        tmp_path, processes, stats_socket):
    config, fake, actor, run_dir = run_actor(
        tmp_path, processes, lambda d: FakeServer(d, pendulum_actions, BAD_REPLIES),
        ["env.id=Pendulum-v1"], SPLITS * CHUNKS_PER_SPLIT)
    # The actor rejected every spoiled reply, took the proper one after it, and stayed
    # alive. (Heartbeats queue up on the stats stream: read on to a recent one.)
    counters, deadline = {}, time.monotonic() + 10
    while counters.get("wire_rejected", 0) < len(BAD_REPLIES) and time.monotonic() < deadline:
        if stats_socket.poll(100):
            got = receive(stats_socket, STATS.binder_receives, RejectCounter())
            counters = got[1].meta["counters"]
    assert counters["wire_rejected"] == len(BAD_REPLIES)
    assert counters["infer_timeouts"] == 0
    assert actor.poll() is None
    stop(actor, run_dir)
    assert fake.rejects.count == 0

    # Twins of the actor's envs, stepped by hand with the clipped actions, are the oracle:
    # split s holds envs s*N .. s*N+N-1, seeded by env_seed(seed, actor 0, env index).
    twins, twin_obs = [], []
    for s in range(SPLITS):
        envs = [gym.make("Pendulum-v1") for _ in range(N)]
        first = [env.reset(seed=env_seed(config.seed, 0, s * N + i))[0]
                 for i, env in enumerate(envs)]
        twins.append(envs)
        twin_obs.append(np.stack(first))
    per_split = [0] * SPLITS
    for chunk in fake.chunks:
        assert chunk["actions"].shape == (T, N, 1) and chunk["actions"].dtype == np.float32
        assert chunk["obs"].shape == (T + 1, N, 3)
        # The chunk keeps the actions as sampled: log-probabilities are of these.
        np.testing.assert_array_equal(chunk["actions"][:, 0], 5.0)
        np.testing.assert_array_equal(chunk["actions"][:, 1], 0.5)
        np.testing.assert_array_equal(chunk["logp"], -0.5)
        owners = [s for s in range(SPLITS) if np.array_equal(twin_obs[s], chunk["obs"][0])]
        assert len(owners) == 1, "each chunk continues exactly one split"
        s = owners[0]
        per_split[s] += 1
        for t in range(T):
            stepped = [env.step(np.clip(a, -2.0, 2.0))
                       for env, a in zip(twins[s], chunk["actions"][t], strict=True)]
            np.testing.assert_allclose(chunk["obs"][t + 1], np.stack([x[0] for x in stepped]),
                                       rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(chunk["rewards"][t], [x[1] for x in stepped],
                                       rtol=1e-6, atol=1e-6)
            assert not any(x[2] or x[3] for x in stepped)
        twin_obs[s] = chunk["obs"][T]
    assert sum(per_split) == len(fake.chunks) and min(per_split) >= 1
    for envs in twins:
        for env in envs:
            env.close()


# A probe environment the actor imports from this module: it echoes the action it was
# stepped with as its next observation, so the chunk shows what the env received.
PROBE_ID = "ClipProbe-v0"
PROBE_LOW = np.array([-1.0, 0.0, -0.5], np.float32)
PROBE_HIGH = np.array([1.0, 3.0, 0.5], np.float32)


class ClipProbe(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(PROBE_LOW, PROBE_HIGH, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        received = np.asarray(action, np.float32)
        # Something outside the space (or of another shape) makes the reward NaN.
        inside = received.shape == (3,) and bool(np.all((received >= PROBE_LOW)
                                                        & (received <= PROBE_HIGH)))
        return received.copy(), 1.0 if inside else float("nan"), False, False, {}


if PROBE_ID not in gym.envs.registry:
    gym.register(PROBE_ID, entry_point=ClipProbe)


PROBE_ACTIONS = np.array([[5.0, -5.0, 0.0], [-0.5, 2.5, 0.7], [-3.0, 10.0, -0.2],
                          [1.0, 0.0, -0.5], [0.99, 3.01, -9.0]], np.float32)


class ProbeServer(FakeServer):
    """Row r of reply k gets PROBE_ACTIONS[(r + k) % 5]: below, inside, on and above bounds."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir, self.probe_actions)

    def probe_actions(self, obs: np.ndarray) -> np.ndarray:
        rows = np.arange(len(obs)) + self.replies
        return PROBE_ACTIONS[rows % len(PROBE_ACTIONS)]


@pytest.mark.slow
def test_actor_clips_each_dimension_to_the_action_space(tmp_path, processes, stats_socket,
                                                         monkeypatch):
    # The actor process finds the probe by importing this module: make the repo importable.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env_id = f"{__name__}:{PROBE_ID}"
    spec = env_spec(EnvConfig(id=env_id))
    assert spec.continuous and spec.action_dim == 3
    np.testing.assert_array_equal(spec.action_low, PROBE_LOW)
    _, fake, actor, run_dir = run_actor(tmp_path, processes,
                                        ProbeServer,
                                        [f"env.id={env_id}"], SPLITS * CHUNKS_PER_SPLIT)
    stop(actor, run_dir)
    assert fake.rejects.count == 0
    clipped_somewhere = 0
    for chunk in fake.chunks:
        actions = chunk["actions"]
        assert actions.shape == (T, N, 3) and actions.dtype == np.float32
        # The env received exactly the clipped action; the chunk kept the sampled one.
        np.testing.assert_array_equal(chunk["obs"][1:], np.clip(actions, PROBE_LOW, PROBE_HIGH))
        np.testing.assert_array_equal(chunk["rewards"], 1.0)
        clipped_somewhere += int((actions < PROBE_LOW).sum() + (actions > PROBE_HIGH).sum())
        inside = (actions >= PROBE_LOW) & (actions <= PROBE_HIGH)
        assert inside.any()
    assert clipped_somewhere > 0


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_pendulum_ppo_runs_end_to_end(processes, tmp_path):
    run_dir = tmp_path / "run"
    process = processes.start(
        [sys.executable, "-m", "srl_jax.launch", "pendulum_ppo", "--run-dir", str(run_dir),
         "--set", "stop.target_return=null"],
        log=tmp_path / "launch.log")
    rows = stop_when(process, run_dir, lambda row: row["env_frames"] >= 20_000
                     and "learner/loss" in row, 120, tmp_path / "launch.log")
    returns = [r["episode_return_mean"] for r in rows if "episode_return_mean" in r]
    # Pendulum's rewards lie in [-16.3, 0]: a 200-step episode returns in [-3300, 0].
    assert returns and all(math.isfinite(r) and -3300 <= r <= 0 for r in returns)
    trained = [r for r in rows if "learner/loss" in r]
    assert trained and all(math.isfinite(r["learner/loss"]) and math.isfinite(r["learner/entropy"])
               for r in trained)


@pytest.mark.slow
def test_halfcheetah_ppo_streams_float32_observations_end_to_end(processes, tmp_path):
    config = load_config(REPO / "configs" / "halfcheetah_ppo.yaml")
    spec = env_spec(config.env)
    assert spec.obs_shape == (17,) and spec.obs_dtype == np.float32, "MuJoCo's float64, cast"
    assert spec.continuous and spec.action_dim == 6
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", "halfcheetah_ppo", "--run-dir",
            str(run_dir)]
    for override in ("actors.count=1", "actors.envs=2", "actors.splits=1",
                     "actors.trajectory_length=32", "inference.max_batch=4",
                     "learner.batch_envs=2", "learner.sample_queue=2", "learner.ppo.epochs=1",
                     "learner.ppo.minibatches=2"):
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    rows = stop_when(process, run_dir, lambda row: row["env_frames"] >= 3000
                     and row["learner_steps"] >= 1, 90, tmp_path / "launch.log")
    assert rows[-1]["env_frames"] >= 3000 and rows[-1]["learner_steps"] >= 1
    assert rows[-1]["system/wire_rejected"] == 0
    assert any(r.get("inference/batch_rows_mean", 0) > 0 for r in rows)
