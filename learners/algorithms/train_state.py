"""What every algorithm trains on and keeps: the batch and the train state pytrees."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from srl_jax.dataflow.chunk_spec import CHUNK_FIELDS, ChunkField, batch_arrays, batch_fields


def batch_type(fields: tuple[ChunkField, ...] = CHUNK_FIELDS) -> type[Batch]:
    """A NamedTuple pytree of the fields the learner trains on (`srl_jax.dataflow.chunk_spec`)."""
    # typeshed types NamedTuple's functional form as an instance, not the class it makes
    return NamedTuple(  # type: ignore[return-value]
        "Batch", [(name, jax.Array) for name in batch_fields(fields)])


if TYPE_CHECKING:

    class Batch(tuple[Any, ...]):
        """A [T+1, B] block of trajectory chunks: the update's input, one field per
        trained-on chunk field (`CHUNK_FIELDS`), in its batch dtype (flags as float).
        Its fields are known at run time only: the type checker reads any name as one."""

        _fields: tuple[str, ...]

        def __new__(cls, **fields: Any) -> Batch: ...
        def __getattr__(self, name: str) -> jax.Array: ...
        def _replace(self, **fields: Any) -> Batch: ...
        def _asdict(self) -> dict[str, jax.Array]: ...
else:
    Batch = batch_type()


def to_batch(arrays: dict[str, np.ndarray]) -> Batch:
    """Host arrays of a [T+1, B] batch (as the sample queue gives them) as the update's input."""
    return Batch(**batch_arrays(arrays))


class TrainState(NamedTuple):
    """Everything the learner trains and saves: one pytree.

    `params` are the policy parameters as published (network weights and
    observation statistics); the optimizer only sees `params["net"]`.
    """

    params: Any
    opt_state: Any
    key: jax.Array
    version: jax.Array  # int32 scalar: number of updates so far
    extra: Any = ()
    """The algorithm's own state (`Algorithm.init_extra`; DQN: its target network)."""
    hyper: Any = ()
    """The live hyperparameters' current values (`Algorithm.live`): name -> float32
    scalar. Data, not constants of the compiled update, so they can change between
    updates (population-based training) and are checkpointed with the rest."""


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     seed: int | jax.Array,
                     init_extra: Callable[[Any], Any] | None = None,
                     hyper: Mapping[str, float | jax.Array] | None = None) -> TrainState:
    """Version 0 of the state; `init_extra`: the algorithm's own state from the initial
    parameters (`Algorithm.init_extra`), or none; `hyper`: the live hyperparameters'
    starting values (`algorithms.live_values`), or none (the update then uses its
    config's)."""
    extra = init_extra(params) if init_extra is not None else ()
    live = {name: jnp.asarray(value, jnp.float32) for name, value in (hyper or {}).items()}
    return TrainState(params, optimizer.init(params["net"]), jax.random.key(seed + 1),
                      jnp.zeros((), jnp.int32), extra, live or ())


def descend(net: Any, updates: Any, learning_rate: float | jax.Array) -> Any:
    """`net` moved by `-learning_rate * updates`: the step size applied outside the
    optimizer, so it can be a traced value of `TrainState.hyper` (optax.adam(lr) is
    scale_by_adam followed by exactly this)."""
    return optax.apply_updates(net, jax.tree.map(lambda u: -learning_rate * u, updates))


def weighted_mean(x: jax.Array, weights: jax.Array) -> jax.Array:
    """The mean of `x` over the rows whose weight is 1 (the activity mask): padding rows
    of agents out of play count for nothing; 0 when no row counts."""
    return jnp.sum(x * weights) / jnp.maximum(jnp.sum(weights), 1.0)
