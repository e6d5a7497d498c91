"""The learner without sockets or processes: a train state on a device mesh, stepped on batches.

In the spirit of Acme's `Learner`: built whole by its constructor from what it
is given (the env spec, the network, the optimizer, the algorithm's update, the
device mesh, the `Inputs` it trains on, a seed and optionally a `Checkpointer`),
it builds the train state replicated on the mesh; `compile` compiles the update for
batches of this process's columns (trajectory chunks) or rows (replay samples), which
else the first step does: the learner worker publishes the parameters between the two,
so that servers act while the update compiles (seconds to minutes).
`step` trains on one batch; `params` and `version` are what a publisher sends;
`save` and `restore` go through the checkpointer; `set_hyperparams` changes the
live hyperparameters (`Algorithm.live`) from the next update on, without
recompiling. The learner worker (learners/learner_worker.py) wraps it in a
process; tests and benchmarks use it on arrays.

With several JAX processes every process builds the same Learner and must call
`step`, `save` and `set_hyperparams` together (they are collectives); the worker
agrees on that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh

from learners.algorithms.train_state import TrainState, init_train_state, to_batch
from learners.models.networks import init_policy_params, make_policy
from learners.models.param_codec import host_value
from learners.training.checkpoint import Checkpointer
from learners.training.mesh import (
    ENV_AXIS,
    compile_update,
    make_learner_mesh,
    put_batch,
    replicated,
)
from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import (
    algorithm,
    algorithm_config,
    extra_initializer,
    live_values,
    sampled_fields,
    sampled_window,
    sizes,
)
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import (
    ReplayField,
    empty_replay_batch,
    replay_batch_fields,
    replay_fields,
)
from srl_jax.runtime.placement import planned_learner_devices

UpdateFn = Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]
PER_ROW = "priorities"
"""The one metric an update may return per batch row (a replay algorithm's new
priorities); `Learner.step` hands it back as a host array, the others as floats."""


class Inputs(NamedTuple):
    """What the update trains on: an example of this process's host batch, how host
    arrays become the update's input, and the axis split over the mesh."""

    example: dict[str, np.ndarray]
    convert: Callable[[dict[str, np.ndarray]], Any]
    axis: int


def chunk_inputs(trajectory_length: int, batch_envs: int, spec: EnvSpec) -> Inputs:
    """[T+1, B] trajectory batches (`srl_jax.dataflow.chunk_spec`), split on the env columns."""
    return Inputs(empty_chunk(trajectory_length, batch_envs, spec), to_batch, ENV_AXIS)


def replay_inputs(rows: int, window: int, spec: EnvSpec,
                  fields: tuple[ReplayField, ...] | None = None) -> Inputs:
    """[B] sampled replay batches (`srl_jax.dataflow.replay_spec`: transitions, or sequences
    with `fields` of sequences and `window` their length T), split on the rows."""
    fields = fields or replay_fields(sequences=False)
    trained = replay_batch_fields(fields)

    def convert(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: arrays[name] for name in trained}

    return Inputs(empty_replay_batch(rows, window, spec, fields), convert, 0)


def check_splits(inputs: Inputs, devices: int) -> None:
    """ConfigError unless every array of the batch splits evenly over the mesh's devices
    on its batch axis: a per-env field (the global state) has one column per env, so
    in a multi-agent env the columns over the agents per env must divide too."""
    for name, array in inputs.example.items():
        columns = array.shape[inputs.axis]
        if columns % devices:
            raise ConfigError(
                f"'learner.batch_envs': the batch's '{name}' has {columns} columns (per "
                f"learner process), which do not divide over its {devices} devices: in a "
                "multi-agent env, batch_envs / learner.processes / agents per env must "
                "divide by learner.devices")


def train_state_init(spec: EnvSpec, network: nn.Module, optimizer: optax.GradientTransformation,
                     init_extra: Callable[[Any], Any] | None
                     ) -> Callable[[jax.Array, dict[str, jax.Array]], TrainState]:
    """(seed, hyperparameters) -> version 0 of the train state, for jit: taking them as
    arguments, not as constants of the program, a run with another seed or other
    starting values finds its program in the compilation cache (0.7 s of start-up)."""

    def init(seed: jax.Array, hyper: dict[str, jax.Array]) -> TrainState:
        params = init_policy_params(network, spec.obs_shape, seed)
        return init_train_state(params, optimizer, seed, init_extra, hyper)

    return init


def init_arguments(seed: int, hyper: dict[str, float] | None
                   ) -> tuple[np.uint32, dict[str, np.float32]]:
    """`train_state_init`'s arguments: the seed as uint32 (JAX keeps an int seed's low
    32 bits, so the keys are the int's), the hyperparameters as float32."""
    return np.uint32(seed % 2**32), {name: np.float32(value)
                                     for name, value in (hyper or {}).items()}


class Learner:
    """One policy's train state on a mesh, and its compiled update."""

    def __init__(self, spec: EnvSpec, network: nn.Module, optimizer: optax.GradientTransformation,
                 update: UpdateFn, mesh: Mesh, inputs: Inputs, seed: int,
                 checkpointer: Checkpointer | None = None,
                 init_extra: Callable[[Any], Any] | None = None,
                 hyper: dict[str, float] | None = None) -> None:
        """Build the state (`compile` compiles `update`).

        `inputs`: this process's share of a batch (all of it with one process).
        `init_extra`: the algorithm's own state (e.g. DQN's target network) from the
        initial parameters, kept in `TrainState.extra`.
        `hyper`: the starting values of the live hyperparameters
        (`algorithms.live_values`), kept in `TrainState.hyper`.
        """
        self.mesh = mesh
        self.inputs = inputs
        self.checkpointer = checkpointer
        self.version = 0
        """Updates made so far (restored with a checkpoint): the published parameters'
        version."""
        check_splits(inputs, len(mesh.local_devices))
        # Built inside jit so that every process makes its replica of the same state.
        init = jax.jit(train_state_init(spec, network, optimizer, init_extra),
                       out_shardings=replicated(mesh))
        self.state = init(*init_arguments(seed, hyper))
        self._update_fn = update
        self._update: UpdateFn | None = None
        """The compiled update, once `compile` has run."""

    def compile(self) -> UpdateFn:
        """Compile the update for this learner's batches (slow: seconds to minutes)."""
        self._update = compile_update(self._update_fn, self.mesh, self.state,
                                      self.put(self.inputs.example), self.inputs.axis)
        return self._update

    @property
    def params(self) -> Any:
        """The current policy parameters (on the mesh)."""
        return self.state.params

    def hyperparams(self) -> dict[str, float]:
        """The live hyperparameters' current values."""
        return {name: float(host_value(value)) for name, value in dict(self.state.hyper).items()}

    def set_hyperparams(self, values: dict[str, float]) -> None:
        """Use `values` (name -> float) from the next update on, and checkpoint them.

        Placed replicated on the mesh like the rest of the state, as float32 scalars, so
        the compiled update takes them as they are. ValueError for a name that is not
        live or a value that is not finite. With several processes, every one calls it
        with the same values (JAX checks that they agree).
        """
        live = dict(self.state.hyper)
        unknown = sorted(set(values) - set(live))
        if unknown:
            raise ValueError(f"not live hyperparameters: {', '.join(unknown)} (live: "
                             f"{', '.join(sorted(live)) or 'none'})")
        host = {name: np.asarray(value, np.float32) for name, value in values.items()}
        bad = sorted(name for name, value in host.items() if not np.isfinite(value))
        if bad:
            raise ValueError(f"hyperparameters must be finite: {', '.join(bad)}")
        live.update(jax.device_put(host, replicated(self.mesh)))
        self.state = self.state._replace(hyper=live)

    def put(self, arrays: dict[str, np.ndarray]) -> Any:
        """Host arrays of a batch onto the mesh, split on the inputs' batch axis."""
        return put_batch(self.inputs.convert(arrays), self.mesh, self.inputs.axis)

    def step(self, batch: dict[str, np.ndarray] | Any,
             overlap: Callable[[], None] | None = None) -> dict[str, Any]:
        """One update on `batch` (host arrays, or a `put` batch), compiled first unless
        `compile` was; returns its metrics, floats but for `PER_ROW` (a host array over
        the whole batch).

        `overlap` runs while the update does (e.g. putting the next batch on the
        mesh), before `version` counts this update.
        """
        if isinstance(batch, dict) and all(isinstance(a, np.ndarray) for a in batch.values()):
            batch = self.put(batch)  # host arrays, not yet `put`
        update = self._update if self._update is not None else self.compile()
        self.state, metrics = update(self.state, batch)
        if overlap is not None:
            overlap()
        host = {name: np.asarray(host_value(value)) if name == PER_ROW
                else float(host_value(value)) for name, value in metrics.items()}
        self.version += 1
        return host

    def save(self, meta: dict[str, Any]) -> float:
        """Start checkpointing the state as `version`; returns the seconds it held us up."""
        if self.checkpointer is None:
            raise ValueError("this Learner was built without a checkpointer")
        return self.checkpointer.save(self.version, self.state, meta)

    def adopt(self, state: TrainState) -> None:
        """Train on from another learner's state (a population member copying its donor):
        its parameters, optimizer state and the rest, with this learner's own random key,
        and one version past its own, so that its servers take the copied parameters."""
        self.version += 1
        self.state = state._replace(key=self.state.key, version=self.state.version + 1)

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


def build_learner(config: ExperimentConfig, spec: EnvSpec, local_envs: int,
                  checkpointer: Checkpointer | None = None) -> Learner:
    """The Learner of `config`'s network and algorithm on the devices the placement plan
    gave this process (else `learner.devices`), for `local_envs` env columns (or sampled
    rows) of each batch: all of them with one process."""
    policy, network = make_policy(config, spec)
    algo = algorithm(config.learner.algorithm)
    algo_config, derived = algorithm_config(config), sizes(config)
    optimizer = algo.make_optimizer(algo_config, derived)
    if algo.replay is not None:
        inputs = replay_inputs(local_envs, sampled_window(config), spec, sampled_fields(algo))
    else:
        inputs = chunk_inputs(config.actors.trajectory_length, local_envs, spec)
    return Learner(spec, network, optimizer,
                   algo.make_update(policy, optimizer, algo_config, derived),
                   make_learner_mesh(planned_learner_devices() or config.learner.devices,
                                     config.learner.batch_envs),
                   inputs, config.seed, checkpointer, extra_initializer(algo, algo_config),
                   live_values(algo, algo_config))
