"""R2D2: value rescaling, windows and targets within a sequence on hand-checked cases,
sequence priorities, the sequence replay buffer, the config checks, and a learner that
fits its targets from stored states."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actors.envs import policy_spec
from learners.algorithms.r2d2 import (
    rescale,
    sequence_priorities,
    sequence_targets,
    sequence_windows,
    unrescale,
)
from learners.training.learner import build_learner
from replay.sequence_buffer import SequenceBuffer
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import SEQUENCE_FIELDS, replay_layout

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cartpole_r2d2.yaml"
RECURRENT = EnvSpec((3,), np.dtype(np.float32), 2, False, state_size=4)


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
    with pytest.raises(ValueError, match="sequences are 5 steps"):
        buffer.sample(4, 3)


@pytest.mark.parametrize(("overrides", "message"), [
    (["network.core=none", "learner.burn_in=0"], "'r2d2' replays whole sequences"),
    (["replay.initial_priority=actor"], "'replay.initial_priority': 'r2d2' starts each"),
    (["learner.r2d2.n_step=16"], "must not exceed the steps trained per sequence (15"),
])
def test_bad_r2d2_configs_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        algorithm_config(load_config(CONFIG, overrides))


def test_updates_fit_sequence_targets_from_the_stored_state() -> None:
    config = load_config(CONFIG, ["learner.batch_envs=8", "learner.r2d2.learning_rate=0.003"])
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
    assert T - config.learner.burn_in == 15
    q = jax.tree.leaves(learner.params)
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in q)
