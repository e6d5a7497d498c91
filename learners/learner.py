"""The learner without sockets or processes: a train state on a device mesh, stepped on batches.

In the spirit of Acme's `Learner`: built whole by its constructor from what it
is given (the env spec, the network, the optimizer, the algorithm's update, the
device mesh, a seed and optionally a `Checkpointer`), it builds the train state
replicated on the mesh and compiles the update for batches of this process's
columns. `step` trains on one batch; `params` and `version` are what a publisher
sends; `save` and `restore` go through the checkpointer. The learner worker
(learners/learner_worker.py) wraps it in a process; tests and benchmarks use it
on arrays.

With several JAX processes every process builds the same Learner and must call
`step` and `save` together (they are collectives); the worker agrees on that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh

from learners.mesh import compile_update, put_batch, replicated
from learners.networks import init_policy_params
from learners.param_codec import host_value
from learners.train_state import Batch, TrainState, init_train_state, to_batch
from srl_jax.checkpoint import Checkpointer
from srl_jax.chunk_spec import empty_chunk
from srl_jax.env_spec import EnvSpec

UpdateFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]


class Learner:
    """One policy's train state on a mesh, and its compiled update."""

    def __init__(self, spec: EnvSpec, network: nn.Module, optimizer: optax.GradientTransformation,
                 update: UpdateFn, mesh: Mesh, trajectory_length: int, batch_envs: int,
                 seed: int, checkpointer: Checkpointer | None = None) -> None:
        """Build the state and compile `update` (slow: seconds to minutes).

        `batch_envs`: this process's columns of a batch (all of them with one process).
        """
        self.mesh = mesh
        self.checkpointer = checkpointer
        self.version = 0
        """Updates made so far (restored with a checkpoint): the published parameters'
        version."""
        # Built inside jit so that every process makes its replica of the same state.
        self.state = jax.jit(
            lambda: init_train_state(init_policy_params(network, spec.obs_shape, seed),
                                     optimizer, seed),
            out_shardings=replicated(mesh))()
        example = self.put(empty_chunk(trajectory_length, batch_envs, spec))
        self._update = compile_update(update, mesh, self.state, example)

    @property
    def params(self) -> Any:
        """The current policy parameters (on the mesh)."""
        return self.state.params

    def put(self, arrays: dict[str, np.ndarray]) -> Batch:
        """Host arrays of a [T+1, B] batch onto the mesh, split on the env axis."""
        return put_batch(to_batch(arrays), self.mesh)

    def step(self, batch: dict[str, np.ndarray] | Batch,
             overlap: Callable[[], None] | None = None) -> dict[str, float]:
        """One update on `batch` (host arrays, or a `put` batch); returns its metrics.

        `overlap` runs while the update does (e.g. putting the next batch on the
        mesh), before `version` counts this update.
        """
        if isinstance(batch, dict):
            batch = self.put(batch)
        self.state, metrics = self._update(self.state, batch)
        if overlap is not None:
            overlap()
        host = {name: float(host_value(value)) for name, value in metrics.items()}
        self.version += 1
        return host

    def save(self, meta: dict[str, Any]) -> float:
        """Start checkpointing the state as `version`; returns the seconds it held us up."""
        if self.checkpointer is None:
            raise ValueError("this Learner was built without a checkpointer")
        return self.checkpointer.save(self.version, self.state, meta)

    def restore(self) -> dict[str, Any] | None:
        """Continue from the checkpointer's newest complete checkpoint, if there is one.

        Returns its meta (None when there is none, or no checkpointer); `version`
        becomes its step.
        """
        if self.checkpointer is None:
            return None
        restored = self.checkpointer.restore(self.state)
        if restored is None:
            return None
        self.state, self.version = restored.state, restored.step
        return restored.meta
