"""A check every algorithm's update must pass, shared by the algorithm tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


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
