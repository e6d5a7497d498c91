"""A check every algorithm's update must pass, shared by the algorithm tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax
import pytest

from learners.algorithms.train_state import Batch, TrainState, init_train_state
from learners.models.networks import Policy, init_policy_params, make_policy
from srl_jax.dataflow.algorithms import Sizes
from srl_jax.dataflow.env_spec import EnvSpec, with_network
from tests.conftest import make_config

T, B, OBS_SHAPE, ACTIONS_N = 8, 4, (4,), 2
SIZES = Sizes(trajectory_length=T, batch_envs=B, total_updates=0, reward_scale=1.0,
              reward_clip=0.0)
"""The sizes of `random_batch`, in a run without a frame limit."""
CORE_SIZE = 8
"""Units of the recurrent core of `small_policy_state(core=...)`."""


def sizes_for(core: str, burn_in: int = 0) -> Sizes:
    """`SIZES` for a policy with `core` ('none', 'lstm' or 'gru')."""
    return dataclasses.replace(SIZES, recurrent=core != "none", burn_in=burn_in)


def single_agent_batch(**fields: Any) -> Batch:
    """A `Batch` of `fields` and, for the fields only multi-agent envs fill, what a
    single-agent actor sends: every row active, no action mask, no global state."""
    T1, B = fields["values"].shape[:2]
    return Batch(**fields, active=np.ones((T1 - 1, B), np.float32),
                 action_mask=np.ones((T1 - 1, B, 0), bool),
                 global_state=np.zeros((T1, B, 0), np.float32),
                 trunc_global_state=np.zeros((T1 - 1, B, 0), np.float32))


def random_batch(seed: int = 0, state_size: int = 0) -> Batch:
    """A [T+1, B] CartPole-shaped batch with some terminations and truncations, and a
    random stored state of `state_size` floats per column."""
    rng = np.random.default_rng(seed)
    terminated = rng.random((T, B)) < 0.1
    truncated = (rng.random((T, B)) < 0.1) & ~terminated
    return single_agent_batch(
        obs=rng.normal(size=(T + 1, B, *OBS_SHAPE)).astype(np.float32),
        actions=rng.integers(0, ACTIONS_N, (T, B)).astype(np.int32),
        logp=np.full((T, B), np.log(0.5), np.float32),
        values=rng.normal(size=(T + 1, B)).astype(np.float32),
        rewards=np.ones((T, B), np.float32),
        terminated=terminated.astype(np.float32),
        truncated=truncated.astype(np.float32),
        trunc_values=rng.normal(size=(T, B)).astype(np.float32),
        state=rng.normal(size=(1, B, state_size)).astype(np.float32),
    )


def small_policy_state(optimizer: optax.GradientTransformation,
                       core: str = "none") -> tuple[Policy, TrainState]:
    """A small real categorical actor-critic (with a recurrent `core`, or none) and its
    train state, from a fixed seed."""
    config = make_config(["network.hidden=[16, 16]", f"network.core={core}",
                          f"network.core_size={CORE_SIZE}"])
    spec = with_network(EnvSpec(OBS_SHAPE, np.dtype(np.float32), ACTIONS_N, False), config.network)
    policy, network = make_policy(config, spec)
    params = init_policy_params(network, OBS_SHAPE, seed=3)
    return policy, init_train_state(params, optimizer, seed=3)


def check_update_trains_and_repeats(update: Callable, fresh_state: Callable[[], tuple],
                                    batch: Any, metric_keys: Sequence[str]) -> dict[str, float]:
    """One update from a fresh state gives finite scalar metrics, version 1 and moves every
    parameter leaf; a second gives version 2; a second fresh state repeats the first bit
    for bit. Returns the first update's metrics."""
    _, _, state = fresh_state()
    before = jax.tree.map(np.array, state.params["net"])  # host copies: the state is donated
    state1, metrics = update(state, batch)
    assert all(np.ndim(v) == 0 for v in metrics.values()), "metrics are scalars"
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    for key in metric_keys:
        assert key in metrics and np.isfinite(metrics[key]), key
    assert int(state1.version) == 1
    after = jax.tree.map(np.array, state1.params["net"])
    assert jax.tree.structure(after) == jax.tree.structure(before)
    changed = [not np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)]
    assert all(changed), "every parameter leaf should move after an update"

    state2, _ = update(state1, batch)
    assert int(state2.version) == 2

    _, _, again = fresh_state()
    again1, metrics_again = update(again, batch)
    for a, b in zip(jax.tree.leaves(jax.device_get(again1.params["net"])),
                    jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert float(metrics_again["loss"]) == metrics["loss"]
    return metrics


def check_value_loss_halves(update: Callable, state: Any, batch: Any, steps: int) -> None:
    """Repeated updates on one fixed batch at least halve the value loss."""
    losses = []
    for _ in range(steps):
        state, metrics = update(state, batch)
        losses.append(float(metrics["value_loss"]))
    assert int(state.version) == steps
    assert losses[-1] < 0.5 * losses[0], losses


def check_pinned(update: Callable, state: Any, batch: Any, pinned: dict[str, float]) -> None:
    """One update's metrics and where it moved the parameters (`moved`: their change
    along a fixed random direction) are the `pinned` numbers, which an earlier version
    of the update computed: a restructuring of the update must leave them as they are.
    Matrix products in full float32 (no TF32 on a GPU), so every backend agrees."""
    before = jax.tree.map(np.array, state.params["net"])  # host copies: the state is donated
    with jax.default_matmul_precision("float32"):
        new_state, metrics = update(state, batch)
    after = jax.tree.leaves(jax.device_get(new_state.params["net"]))
    direction = np.random.default_rng(0)
    moved = sum(float(np.sum((np.asarray(a, np.float64) - b) * direction.normal(size=b.shape)))
                for a, b in zip(after, jax.tree.leaves(before), strict=True))
    got = {**{key: float(metrics[key]) for key in pinned if key != "moved"}, "moved": moved}
    assert got == pytest.approx(pinned, rel=1e-4, abs=1e-6)
