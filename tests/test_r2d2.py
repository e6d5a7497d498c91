"""R2D2: value rescaling, windows and targets within a sequence on hand-checked cases,
sequence priorities, the sequence replay buffer, the sequences its section sets (burn-in
prefix, trained length, period) and their checks, and a learner that fits its targets
from stored states."""

from __future__ import annotations

import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actors.env_ring import ChunkBuilder, StepResult
from actors.envs import policy_spec
from learners.algorithms.r2d2 import (
    make_update,
    rescale,
    sequence_priorities,
    sequence_targets,
    sequence_windows,
    unrescale,
)
from learners.algorithms.train_state import init_train_state
from learners.models.networks import init_policy_params, make_policy
from learners.training.learner import build_learner
from replay.sequence_buffer import SequenceBuffer
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import (
    algorithm,
    algorithm_config,
    chunk_overlap,
    extra_initializer,
    resolve_algorithms,
    sampled_fields,
    sampled_window,
    sizes,
)
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import SEQUENCE_FIELDS, empty_replay_batch, replay_layout
from tests.test_config import assert_launch_refuses

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cartpole_r2d2.yaml"
RECURRENT = EnvSpec((3,), np.dtype(np.float32), 2, False, state_size=4)
BARE = """
env: {id: CartPole-v1}
actors: {count: 1, envs: 4, splits: 1, epsilon: 0.4}
replay: {count: 1}
learner: {algorithm: r2d2, batch_envs: 2}
network: {head: dueling, hidden: [8], core: lstm, core_size: 8}
stop: {wall_time_s: 10}
"""
"""An r2d2 run that leaves its sequences to the defaults (a tiny network)."""


def bare_config(tmp_path: Path) -> ExperimentConfig:
    path = tmp_path / "bare_r2d2.yaml"
    path.write_text(BARE)
    return resolve_algorithms(load_config(path))


def test_value_rescaling_is_inverted_by_its_closed_form() -> None:
    x = jnp.array([-1000.0, -10.0, -0.5, 0.0, 0.3, 7.0, 5000.0])
    np.testing.assert_allclose(unrescale(rescale(x, 1e-3), 1e-3), x, rtol=1e-4, atol=1e-4)
    assert float(rescale(jnp.float32(3.0), 1e-3)) == pytest.approx(1.0 + 3e-3)  # sqrt(4) - 1


def test_windows_stop_at_an_episode_end_and_at_the_sequence_end() -> None:
    rewards = jnp.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    ends = jnp.array([[False], [True], [False], [False], [False]])
    returns, steps = sequence_windows(rewards, ends, 3, 0.5)
    assert steps[:, 0].tolist() == [2, 1, 3, 2, 1]
    np.testing.assert_allclose(returns[:, 0], [1 + 0.5 * 2, 2, 3 + 0.5 * 4 + 0.25 * 5,
                                               4 + 0.5 * 5, 5])


def test_targets_bootstrap_by_how_each_window_ended() -> None:
    T = 4
    rewards = jnp.ones((T, 1))
    terminated = jnp.array([[0.0], [1.0], [0.0], [0.0]])
    truncated = jnp.array([[0.0], [0.0], [0.0], [1.0]])
    trunc_values = jnp.array([[0.0], [0.0], [0.0], [8.0]])
    next_values = jnp.array([[10.0], [20.0], [30.0], [40.0], [50.0]])  # per observation
    targets = sequence_targets(rewards, terminated, truncated, trunc_values, next_values,
                               n=2, gamma=0.5)
    np.testing.assert_allclose(targets[:, 0], [
        1 + 0.5 * 1,            # steps 0-1, ends in a termination: no bootstrap
        1,                      # step 1 terminates
        1 + 0.5 * 1 + 0.25 * 8,  # steps 2-3, step 3 cut by the time limit: its value
        1 + 0.5 * 8])           # step 3 alone, cut
    rescaled = sequence_targets(rewards, terminated, truncated, rescale(trunc_values, 1e-3),
                                rescale(next_values, 1e-3), n=2, gamma=0.5, epsilon=1e-3)
    np.testing.assert_allclose(unrescale(rescaled, 1e-3), targets, rtol=1e-4)


def test_a_sequence_priority_mixes_the_max_and_the_mean_error() -> None:
    errors = jnp.array([[1.0, 0.0], [-3.0, 0.0], [2.0, 0.0]])
    np.testing.assert_allclose(sequence_priorities(errors, 0.9, 0.0), [0.9 * 3 + 0.1 * 2, 0])


def test_the_sequence_buffer_samples_whole_columns_with_their_stored_state() -> None:
    T, n = 5, 3
    buffer = SequenceBuffer(100, T, n, RECURRENT, 1, 1.0, 0.5, seed=0)
    chunk = empty_chunk(T, n, RECURRENT)
    chunk["rewards"][:] = np.arange(T)[:, None] + 10 * np.arange(n)
    chunk["state"][0] = np.arange(n)[:, None] + np.zeros(4)
    assert buffer.insert(chunk) == T * n and buffer.size == T * n and buffer.items == n
    buffer.update_priorities(np.array([0, 1, 2]), buffer.generations[:3], np.array([1, 0, 3.0]))
    batch = buffer.sample(400, T)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == \
        replay_layout(400, T, RECURRENT, SEQUENCE_FIELDS)
    assert set(batch["slots"].tolist()) == {0, 2}, "a sequence at priority 0 is never drawn"
    for row in range(400):
        column = batch["slots"][row]
        np.testing.assert_array_equal(batch["rewards"][row], np.arange(T) + 10 * column)
        np.testing.assert_array_equal(batch["state"][row], np.full(4, column))
    np.testing.assert_allclose(batch["probabilities"][batch["slots"] == 2], 0.75)
    np.testing.assert_allclose(batch["weights"][batch["slots"] == 2], (3 * 0.75) ** -0.5,
                               rtol=1e-6)
    with pytest.raises(ValueError, match="sampled rows are 5 steps"):
        buffer.sample(4, 3)


def test_sequences_are_the_papers_burn_in_prefix_and_trained_steps(tmp_path: Path) -> None:
    """By default 40 burn-in steps, then 80 trained, starting every 40 steps: 120-step
    chunks that repeat 80 steps of the one before."""
    config = bare_config(tmp_path)
    assert (config.actors.trajectory_length, config.learner.burn_in) == (120, 40)
    assert chunk_overlap(config) == 80
    assert config.learner.algorithms["r2d2"]["trained_length"] == 80
    cartpole = resolve_algorithms(load_config(CONFIG))  # scaled down, explicitly
    assert (cartpole.actors.trajectory_length, cartpole.learner.burn_in,
            chunk_overlap(cartpole)) == (25, 5, 15)


@pytest.mark.parametrize(("overrides", "message"), [
    (["network.core=none", "learner.r2d2.burn_in=0"], "'r2d2' replays whole sequences"),
    (["replay.initial_priority=actor"], "'replay.initial_priority': 'r2d2' starts each"),
    (["learner.r2d2.n_step=21"], "'learner.r2d2.n_step' (21) must be in [1, "
                                 "learner.r2d2.trained_length (20)]"),
    (["learner.r2d2.period=21"], "'learner.r2d2.period' (21) must not exceed "
                                 "'learner.r2d2.trained_length' (20)"),
    (["learner.r2d2.burn_in=-1"], "'learner.r2d2.burn_in' must not be negative"),
    (["actors.trajectory_length=64"], "'actors.trajectory_length' (64) is set by "
                                      "'learner.r2d2'"),
    (["learner.burn_in=3"], "'learner.burn_in' (3) is set by 'learner.r2d2'"),
])
def test_bad_r2d2_configs_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve_algorithms(load_config(CONFIG, overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["learner.r2d2.period=100"], "'learner.r2d2.period' (100) must not exceed "
                                  "'learner.r2d2.trained_length' (80)"),
    (["actors.trajectory_length=64"], "'actors.trajectory_length' (64) is set by "
                                      "'learner.r2d2'"),
])
def test_the_launcher_refuses_impossible_sequences_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        overrides: list[str], fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    sequences = ["learner.r2d2.burn_in=40", "learner.r2d2.trained_length=80",
                 "learner.r2d2.period=40"]
    args = ["cartpole_r2d2"]
    for override in [*sequences, *overrides]:
        args += ["--set", override]
    assert_launch_refuses(args, fragment, tmp_path / "run", capsys)


def test_an_update_trains_the_steps_after_the_burn_in_prefix(tmp_path: Path) -> None:
    """On 120-step sequences the loss reads the rewards of steps 40..119 (the 80 trained
    steps), none of the burn-in's."""
    config = bare_config(tmp_path)
    spec, algo = policy_spec(config, "default"), algorithm("r2d2")
    policy, network = make_policy(config, spec)
    r2d2, derived = algorithm_config(config), sizes(config)
    optimizer = algo.make_optimizer(r2d2, derived)
    state = init_train_state(init_policy_params(network, spec.obs_shape, 0), optimizer, 0,
                             extra_initializer(algo, r2d2))
    update = jax.jit(make_update(policy, optimizer, r2d2, derived))
    rng = np.random.default_rng(0)
    batch = empty_replay_batch(2, sampled_window(config), spec, sampled_fields(algo))
    batch = {name: batch[name] for name in algo.fields}
    assert batch["rewards"].shape == (2, 120)
    batch["obs"][:] = rng.normal(size=batch["obs"].shape)
    batch["actions"][:] = rng.integers(0, 2, batch["actions"].shape)
    batch["rewards"][:] = rng.normal(size=batch["rewards"].shape)
    batch["state"][:] = rng.normal(size=batch["state"].shape)
    batch["weights"][:] = 1.0

    def loss(step: int | None) -> float:
        changed = {name: array.copy() for name, array in batch.items()}
        if step is not None:
            changed["rewards"][:, step] += 5.0
        return float(update(state, changed)[1]["loss"])

    base = loss(None)
    assert loss(10) == base and loss(39) == base, "a burn-in step's reward trains nothing"
    assert loss(40) != base and loss(50) != base and loss(119) != base


def test_chunks_of_120_steps_overlapping_by_80_start_40_apart_with_their_state() -> None:
    T, overlap, period, n = 120, 80, 40, 2
    obs = [np.array([[t, i, 0] for i in range(n)], np.float32) for t in range(401)]
    builder = ChunkBuilder(T, obs[0], RECURRENT, overlap=overlap)
    chunks = []
    for t in range(400):
        state = np.array([[t, i, 0, 0] for i in range(n)], np.float32)
        done = builder.on_policy(np.zeros(n, np.int64), np.zeros(n, np.float32),
                                 np.zeros(n, np.float32), t, np.empty(0, np.float32), state)
        if done is not None:
            chunks.append({name: array.copy() for name, array in done.items()})
        builder.on_step(StepResult(
            rewards=np.full(n, float(t), np.float32), terminated=np.zeros(n, bool),
            truncated=np.zeros(n, bool), next_obs=obs[t + 1],
            truncated_envs=np.empty(0, np.int64), final_obs=np.empty((0, 3), np.float32)))
    assert len(chunks) == 1 + (399 - T) // period
    for k, chunk in enumerate(chunks):
        first = k * period
        np.testing.assert_array_equal(chunk["rewards"][:, 0], np.arange(first, first + T))
        np.testing.assert_array_equal(chunk["obs"][:, 1, 0], np.arange(first, first + T + 1))
        np.testing.assert_array_equal(chunk["state"][0, :, :2], [[first, 0], [first, 1]])
    for before, after in itertools.pairwise(chunks):
        np.testing.assert_array_equal(after["rewards"][:overlap], before["rewards"][period:])


def test_updates_fit_sequence_targets_from_the_stored_state() -> None:
    config = resolve_algorithms(load_config(CONFIG, ["learner.batch_envs=8",
                                                     "learner.r2d2.learning_rate=0.003"]))
    spec = policy_spec(config, "default")
    learner = build_learner(config, spec, 8)
    rng = np.random.default_rng(0)
    batch = {name: np.zeros(array.shape, array.dtype)
             for name, array in learner.inputs.example.items()}
    T = config.actors.trajectory_length
    batch["obs"][:] = rng.normal(size=batch["obs"].shape)
    batch["actions"][:] = rng.integers(0, 2, batch["actions"].shape)
    batch["terminated"][:, -1] = 1.0  # every sequence ends its episode: targets are returns
    batch["rewards"][:] = 1.0
    batch["state"][:] = rng.normal(size=batch["state"].shape)
    batch["weights"][:] = 1.0
    losses = []
    for _ in range(150):
        metrics = learner.step(batch)
        losses.append(metrics["loss"])
    assert metrics["priorities"].shape == (8,) and np.all(metrics["priorities"] > 0)
    assert losses[-1] < 0.05 * losses[0]
    assert T - config.learner.burn_in == 20
    q = jax.tree.leaves(learner.params)
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in q)
