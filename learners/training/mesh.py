"""The learner's device mesh: parameters replicated, batches sharded on their batch axis.

The same code runs on 1 CPU, 8 GPUs or a TPU pod slice: one `jax.jit` with
shardings over a one-axis `Mesh` named "data", and the compiler inserts the
gradient all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA = "data"


class MeshError(ValueError):
    """The mesh cannot be built as configured; the message names the key."""


def make_learner_mesh(devices: int | Sequence[int], batch_envs: int) -> Mesh:
    """A data-parallel mesh over `devices` of each process: a count of its first local
    devices (0: all), or indices into its `jax.local_devices()` (the placement plan's)."""
    local = jax.local_devices()
    if isinstance(devices, int):
        count = devices or len(local)
        if count > len(local):
            raise MeshError(f"'learner.devices' is {count} but this process has {len(local)} "
                            f"device(s): {local}")
        indices = list(range(count))
    else:
        indices = list(devices)
        if not indices or max(indices) >= len(local) or min(indices) < 0:
            raise MeshError(f"'learner.devices' {indices} are not all among this process's "
                            f"{len(local)} device(s): {local}")
    chosen = []
    for p in range(jax.process_count()):
        mine = [x for x in jax.devices() if x.process_index == p]
        chosen += [mine[i] for i in indices]
    total = len(chosen)
    if batch_envs % total:
        raise MeshError(f"'learner.batch_envs' ({batch_envs}) must divide evenly over the "
                        f"{total} learner devices")
    return jax.make_mesh((total,), (DATA,), axis_types=(AxisType.Auto,), devices=chosen)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


ENV_AXIS = 1
"""The batch axis of [T(+1), B, ...] trajectory batches; a sampled replay batch [B, ...]
is split on axis 0."""


def batch_sharding(mesh: Mesh, axis: int = ENV_AXIS) -> NamedSharding:
    """Arrays split on `axis` (B: env columns, or sampled rows) over the mesh."""
    return NamedSharding(mesh, P(*([None] * axis), DATA))


def compile_update(update: Callable, mesh: Mesh, state: Any, example_batch: Any,
                   axis: int = ENV_AXIS) -> Callable:
    """Compile the update once for this mesh; the state is donated and stays replicated."""
    jitted = jax.jit(update, in_shardings=(replicated(mesh), batch_sharding(mesh, axis)),
                     out_shardings=(replicated(mesh), replicated(mesh)), donate_argnums=0)
    return jitted.lower(state, example_batch).compile()


def put_batch(batch: Any, mesh: Mesh, axis: int = ENV_AXIS) -> Any:
    """Host arrays onto the mesh, each device getting its slice of the batch axis.

    With several processes each one passes only its local columns (or rows); the
    global batch is their concatenation. On a mesh of one CPU device the host arrays
    are returned as they are: the compiled update copies them in itself, for a fraction
    of `device_put`'s cost (45 against 340 us for a replay batch of six arrays), and
    there is no transfer to overlap with the running update.
    """
    sharding = batch_sharding(mesh, axis)
    if jax.process_count() == 1:
        if mesh.size == 1 and mesh.devices.flat[0].platform == "cpu":
            return batch
        return jax.device_put(batch, sharding)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
