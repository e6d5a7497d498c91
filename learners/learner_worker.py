"""The learner worker: trains on the sample stream and publishes parameters.

Chunks arrive on the sample stream, are checked against the shapes this run
expects, and wait in a bounded `SampleQueue` that enforces the staleness cap.
Each batch of B env columns is put onto the learner's device mesh (split on
the env axis) while the previous update still runs, and goes through one
compiled update of the configured algorithm. The new parameters are published
with the next version number, and re-sent every `learner.republish_interval_s`
so that servers that (re)joined late catch up.

The learner checkpoints its train state and counters (see
`srl_jax.checkpoint`) every `checkpoint.interval_s` and/or
`checkpoint.every_updates`, and once more when told to stop. At start it
restores the newest complete checkpoint of its run directory, if there is one:
that is how a killed learner recovers and how `--resume` continues a run.
"""

from __future__ import annotations

import math
import signal
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
import zmq

from actors.envs import EnvSpec, env_spec
from learners.algorithms import algorithm
from learners.distributed import (
    agree,
    free_address,
    gather_json,
    initialize,
    process_layout,
    shutdown,
)
from learners.jax_runtime import configure_jax
from learners.mesh import compile_update, make_learner_mesh, put_batch, replicated
from learners.networks import init_policy_params, make_policy
from learners.param_codec import host_value, params_to_arrays
from learners.sample_queue import SampleQueue
from learners.train_state import Batch, init_train_state
from srl_jax.checkpoint import Checkpointer
from srl_jax.config import DEFAULT_POLICY, ExperimentConfig, config_to_dict
from srl_jax.metrics import CARRIED
from srl_jax.names import NameService
from srl_jax.stream_table import COORDINATOR, PARAMS, SAMPLES
from srl_jax.streams import make_socket, receive, send
from srl_jax.worker import Worker

SAMPLE_KINDS = frozenset({"samples"})
POLL_MS = 50
MAX_DRAIN = 256
RETURN_WINDOW = 100
"""Training returns averaged to rank checkpoints for `checkpoint.keep_best`."""


def chunk_layout(config: ExperimentConfig,
                 spec: EnvSpec) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array of one actor chunk (see actors/env_ring.py)."""
    T = config.actors.trajectory_length
    n = config.actors.envs // config.actors.splits * spec.agents
    step = ((T, n), np.dtype(np.float32))
    return {
        "obs": ((T + 1, n, *spec.obs_shape), np.dtype(spec.obs_dtype)),
        "actions": ((T, n, *spec.action_shape), spec.action_dtype),
        "logp": step, "values": ((T + 1, n), np.dtype(np.float32)), "rewards": step,
        "terminated": ((T, n), np.dtype(bool)), "truncated": ((T, n), np.dtype(bool)),
        "trunc_values": step, "versions": ((T, n), np.dtype(np.int32)),
    }


def to_batch(arrays: dict[str, np.ndarray]) -> Batch:
    """Host arrays of a [T+1, B] batch as the update's input."""
    fields = {name: arrays[name] for name in Batch._fields}
    fields["terminated"] = fields["terminated"].astype(np.float32)
    fields["truncated"] = fields["truncated"].astype(np.float32)
    return Batch(**fields)


class LearnerWorker(Worker):
    kind = "learner"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        cfg = config.learner
        self.processes = process_layout(config, index)
        self.local_envs = cfg.batch_envs // self.processes.count
        self.queue = SampleQueue(cfg.sample_queue, self.local_envs, cfg.staleness_cap)
        self.version = 0
        self.frames_consumed = 0
        self.frames_received = 0
        self.episodes_received = 0
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.lag_sum = 0.0
        self.lag_count = 0
        self.checkpointer: Checkpointer | None = None
        self.saved_step: int | None = None
        self.checkpoints_saved = 0
        self.time_checkpoint = 0.0
        self._last_save = time.monotonic()
        # Start time in ms: a restarted learner's parameters win over its predecessor's.
        self.incarnation = time.time_ns() // 1_000_000
        self.time_update = 0.0
        self.time_put = 0.0
        self.time_publish = 0.0
        self.train_metrics: dict[str, float] = {}
        self._last_publish = 0.0
        self._next: tuple[Any, np.ndarray] | None = None
        self._stop_requested = False
        self._last_batch_wall = time.time()

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        self._join_processes()
        self.pull = make_socket(self.zmq, zmq.PULL, hwm=self.config.learner.sample_queue)
        self.samples_key = SAMPLES.key(self.policy, self.index)
        self.transport.bind(self.pull, self.names, self.samples_key)
        self.pub = None
        if self.processes.is_chief:
            self.pub = make_socket(self.zmq, zmq.PUB, hwm=self.config.learner.param_queue)
            self.transport.bind(self.pub, self.names, PARAMS.key(self.policy))
        spec = env_spec(self.config.env, self.policy)
        self.layout = chunk_layout(self.config, spec)
        policy, network = make_policy(self.config, spec)
        algo = algorithm(self.config.learner.algorithm)
        optimizer = algo.make_optimizer(self.config)
        self.mesh = make_learner_mesh(self.config.learner.devices, self.config.learner.batch_envs)
        seed = self.config.seed
        with self.busy("building the train state and compiling the update"):
            # Built inside jit so that every process makes its replica of the same state.
            self.state = jax.jit(
                lambda: init_train_state(init_policy_params(network, spec.obs_shape, seed),
                                         optimizer, seed),
                out_shardings=replicated(self.mesh))()
            self._restore()
            example = put_batch(to_batch(self._example_batch()), self.mesh)
            self.update = compile_update(algo.make_update(policy, optimizer, self.config),
                                         self.mesh, self.state, example)
        self.log.info("%s on %d device(s): %s", self.config.learner.algorithm,
                      self.mesh.size, [str(d) for d in self.mesh.devices.flat])
        self._publish()

    def _join_processes(self) -> None:
        """Start jax.distributed with the other learner processes, if there are any."""
        layout = self.processes
        if layout.count > 1 and not layout.coordinator:
            if layout.is_chief:
                address = free_address(self.transport.advertise_host)
                self.names.register(COORDINATOR.key(self.policy), address)
                self.transport.note_port(COORDINATOR.key(self.policy), address)  # gRPC: no CURVE
            else:
                address = self.lookup(COORDINATOR.key(self.policy))
            layout = self.processes = replace(layout, coordinator=address)
        initialize(layout)
        if layout.count > 1:
            # jax.distributed installs a preemption notifier on SIGTERM; ours must win.
            signal.signal(signal.SIGTERM, self.request_stop)
            self.log.info("JAX process %d of %d (coordinator %s)", layout.index, layout.count,
                          layout.coordinator)

    def _restore(self) -> None:
        """Continue from the newest complete checkpoint of this run, if there is one."""
        ckpt = self.config.checkpoint
        if not ckpt.enabled:
            return
        self.checkpointer = Checkpointer(self.run_dir, ckpt.keep, ckpt.keep_best,
                                         ckpt.async_save, self.policy)
        restored = self.checkpointer.restore(self.state)
        if restored is None:
            return
        self.state = restored.state
        self.version = self.saved_step = restored.step
        saved = restored.meta["processes"]
        if len(saved) == self.processes.count:
            counters = saved[self.processes.index]
        else:  # a different learner process count: process 0 carries the run's totals
            counters = {key: sum(c.get(key, 0) for c in saved) if self.processes.is_chief
                        else 0 for key in CARRIED}
        self.frames_consumed = int(counters["frames_consumed"])
        self.frames_received = int(counters["frames_received"])
        self.episodes_received = int(counters["episodes_received"])
        self.lag_sum, self.lag_count = float(counters["lag_sum"]), int(counters["lag_count"])
        self.queue.dropped_stale = int(counters["samples_dropped_stale"])
        self.queue.dropped_full = int(counters["samples_dropped_full"])
        self.recent_returns.extend(restored.meta.get("recent_returns", []))
        self.log.info("restored checkpoint step %d (saved %s)", restored.step,
                      time.strftime("%Y-%m-%d %H:%M:%S",
                                    time.localtime(restored.meta["saved_at"])))

    def _carried(self) -> dict[str, float]:
        """The counters in `srl_jax.metrics.CARRIED`: they belong to the run and are
        checkpointed with the state."""
        return {"frames_consumed": self.frames_consumed, "frames_received": self.frames_received,
                "episodes_received": self.episodes_received, "lag_sum": self.lag_sum,
                "lag_count": self.lag_count, "samples_dropped_stale": self.queue.dropped_stale,
                "samples_dropped_full": self.queue.dropped_full}

    def _save_due(self) -> bool:
        ckpt = self.config.checkpoint
        if self.checkpointer is None or self.version == (self.saved_step or 0):
            return False
        by_time = ckpt.interval_s > 0 and time.monotonic() - self._last_save >= ckpt.interval_s
        by_updates = ckpt.every_updates > 0 and \
            self.version - (self.saved_step or 0) >= ckpt.every_updates
        return by_time or by_updates

    def _save(self) -> None:
        """Checkpoint the state as of now (every learner process takes part)."""
        if self.checkpointer is None or self.version == self.saved_step:
            return
        per_process = [self._carried()]
        if self.processes.count > 1:
            per_process = gather_json(per_process[0])
        returns = list(self.recent_returns)
        meta = {
            "version": self.version, "saved_at": time.time(), "processes": per_process,
            "recent_returns": returns, "config": config_to_dict(self.config),
            **({"episode_return_mean": float(np.mean(returns))} if returns else {}),
        }
        stall = self.checkpointer.save(self.version, self.state, meta)
        self.time_checkpoint += stall
        self.saved_step, self._last_save = self.version, time.monotonic()
        self.checkpoints_saved += 1
        self.log.info("checkpoint step %d started (training held up %.3fs)", self.version, stall)

    def finish(self) -> None:
        """A final checkpoint on a clean stop, waited for."""
        if self.checkpointer is not None:
            self._save()
            start = time.perf_counter()
            self.checkpointer.wait()
            self.log.info("final checkpoint step %d written (waited %.2fs)", self.version,
                          time.perf_counter() - start)

    def _take_episode_returns(self, meta: dict[str, Any]) -> None:
        """Training returns from a chunk's metadata (they rank checkpoints for `best`)."""
        returns = meta.get("episode_returns", [])
        if not isinstance(returns, list) or not all(
                isinstance(r, int | float) and math.isfinite(r) for r in returns):
            self.rejects.reject(ValueError("samples metadata 'episode_returns' is not a list "
                                           "of finite numbers"))
            return
        self.recent_returns.extend(float(r) for r in returns)
        self.episodes_received += len(returns)

    def _example_batch(self) -> dict[str, np.ndarray]:
        B = self.local_envs
        return {name: np.zeros((shape[0], B, *shape[2:]), dtype)
                for name, (shape, dtype) in self.layout.items()}

    def _valid_chunk(self, arrays: dict[str, np.ndarray]) -> bool:
        if arrays.keys() != self.layout.keys():
            self.rejects.reject(ValueError(f"chunk with arrays {sorted(arrays)}"))
            return False
        for name, (shape, dtype) in self.layout.items():
            if arrays[name].shape != shape or arrays[name].dtype != dtype:
                self.rejects.reject(ValueError(
                    f"chunk array {name!r}: {arrays[name].dtype}{list(arrays[name].shape)} "
                    f"where {dtype}{list(shape)} was expected"))
                return False
        return True

    def run_once(self) -> None:
        if self.pull.poll(0 if self._next is not None else POLL_MS):
            for _ in range(MAX_DRAIN):
                received = receive(self.pull, SAMPLE_KINDS, self.rejects)
                if received is None:
                    break
                message = received[1]
                if self._valid_chunk(message.arrays):
                    self.frames_received += message.arrays["rewards"].size
                    self._take_episode_returns(message.meta)
                    self.queue.put(message.arrays, self.version)
        if self._next is None:
            self._next = self._prefetch()
        ready, save = self._next is not None, self._save_due()
        if self.processes.count > 1:
            ready, stop, save = agree(ready, self._stop_requested, save)
            if stop:
                super().request_stop()
                return
        if save:
            self._save()
        if ready:
            self._train()
        elif time.monotonic() - self._last_publish > self.config.learner.republish_interval_s:
            self._publish()

    def request_stop(self, *args: Any) -> None:
        """With several learner processes, stop together (see `agree`), never alone."""
        if self.processes.count > 1 and hasattr(self, "update"):
            self._stop_requested = True
        else:
            super().request_stop(*args)

    def _prefetch(self) -> tuple[Any, np.ndarray] | None:
        """The next batch, already on its way to the devices, with its versions."""
        batch = self.queue.take_batch(self.version)
        if batch is None:
            return None
        start = time.perf_counter()
        on_mesh = put_batch(to_batch(batch), self.mesh)
        self.time_put += time.perf_counter() - start
        self.frames_consumed += batch["rewards"].size
        return on_mesh, batch["versions"]

    def _train(self) -> None:
        batch, versions = self._next
        self._last_batch_wall = time.time()
        lag = self.version - versions
        self.lag_sum += float(lag.sum())
        self.lag_count += lag.size
        start = time.perf_counter()
        with self.busy("updating"):
            self.state, metrics = self.update(self.state, batch)
            self._next = self._prefetch()  # overlaps the transfer with the running update
            metrics = {k: host_value(v) for k, v in metrics.items()}
        self.time_update += time.perf_counter() - start
        self.train_metrics = {k: float(v) for k, v in metrics.items()}
        self.version += 1
        self._publish()

    def _publish(self) -> None:
        if self.pub is None:
            return  # only process 0 publishes
        start = time.perf_counter()
        arrays = params_to_arrays(self.state.params)
        try:
            send(self.pub, "params", {"version": self.version, "incarnation": self.incarnation},
                 arrays, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.debug("parameter stream full; version %d not sent", self.version)
        self._last_publish = time.monotonic()
        self.time_publish += time.perf_counter() - start

    def waiting(self) -> tuple[str, float] | None:
        """Samples, while the queue holds less than a batch."""
        if self._next is None and hasattr(self, "update"):
            return (f"samples on {self.samples_key} ({len(self.queue)} chunks queued)",
                    self._last_batch_wall)
        return super().waiting()

    def counters(self) -> dict[str, float]:
        return {
            "learner_steps": self.version, "policy_version": self.version,
            **self._carried(), "queue_chunks": len(self.queue),
            "checkpoints_saved": self.checkpoints_saved,
            "checkpoint_step": self.saved_step if self.saved_step is not None else -1,
            "time_checkpoint": self.time_checkpoint, "time_update": self.time_update,
            "time_put": self.time_put, "time_publish": self.time_publish,
            **{f"train/{k}": v for k, v in self.train_metrics.items()},
        }

    def close(self) -> None:
        for name in ("pull", "pub"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        shutdown(self.processes)
