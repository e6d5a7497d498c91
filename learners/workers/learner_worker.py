"""The learner worker: the process around a `Learner` (learners/training/learner.py).

Chunks arrive on the sample stream, are checked against the shapes this run
expects, and wait in a bounded `SampleQueue` that enforces the staleness cap.
Each batch of B env columns is put onto the learner's device mesh (split on
the env axis) while the previous update still runs, and goes through one
compiled update of the configured algorithm. An algorithm that learns from
replay gets batches of B sampled transitions from the replay servers instead
(`ReplayIntake`), and each update's new priorities go back to them. The new
parameters are published with the next version number, and re-sent every
`learner.republish_interval_s` so that servers that (re)joined late catch up.

The learner checkpoints its train state and counters (see
`learners.training.checkpoint`) every `checkpoint.interval_s` and/or
`checkpoint.every_updates`, and once more when told to stop, to `checkpoint.dir`
(`srl_jax.config.checkpoint_location`). At start it restores the newest complete
checkpoint there, if there is one: that is how a killed learner recovers and how
`--resume` continues a run.

The worker is a shell with one part per job: `SampleIntake` or `ReplayIntake`
(receive, check, queue), `Learner` (train state and update), `ParamPublisher`,
`SaveSchedule`, `agree` for the multi-process learner (learners/training/distributed.py) and,
when frozen policies play this one's snapshots, `PoolPublisher` (self-play).
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from actors.envs import policy_spec
from learners.algorithms.registry import algorithm, algorithm_config
from learners.algorithms.train_state import Batch
from learners.training.checkpoint import Checkpointer
from learners.training.device_memory import device_memory_counters
from learners.training.distributed import (
    ProcessLayout,
    agree,
    coordinator_host,
    free_address,
    gather_json,
    initialize,
    process_layout,
    shutdown,
)
from learners.training.jax_runtime import configure_jax
from learners.training.learner import PER_ROW, Learner, build_learner
from learners.training.sample_queue import SampleQueue
from learners.training.save_schedule import SaveSchedule
from learners.workers.param_publisher import ParamPublisher
from learners.workers.pool_publisher import PoolPublisher
from learners.workers.replay_intake import ROUTING, ReplayIntake
from learners.workers.sample_intake import SampleIntake
from srl_jax.config.loader import config_to_dict
from srl_jax.config.opponent_pool import SnapshotPool
from srl_jax.config.population import append_lineage, field_name, initial_hyperparams
from srl_jax.config.run_dir import pool_root
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, ExperimentConfig, member_names
from srl_jax.core.chunk_spec import run_chunk_layout
from srl_jax.core.incarnation import FIRST
from srl_jax.core.metrics_table import CARRIED
from srl_jax.core.names import NameService
from srl_jax.core.replay_spec import replay_layout
from srl_jax.core.stream_table import CONTROL, COORDINATOR, PARAMS, POOL, REPLAY, SAMPLES
from srl_jax.core.streams import make_socket, receive, send
from srl_jax.core.worker_base import Worker

POLL_MS = 50


def restored_counters(saved: list[dict[str, float]],
                      processes: ProcessLayout) -> dict[str, float]:
    """This process's run counters from a checkpoint's per-process list.

    With a different learner process count, process 0 carries the run's totals.
    """
    if len(saved) == processes.count:
        return saved[processes.index]
    return {key: sum(c.get(key, 0) for c in saved) if processes.is_chief else 0
            for key in CARRIED}


class LearnerWorker(Worker):
    kind = "learner"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        cfg = config.learner
        self.processes = process_layout(config, index)
        self.local_envs = cfg.batch_envs // self.processes.count
        self.spec = policy_spec(config, policy)
        self.samples_key = SAMPLES.key(policy, index)
        self.from_replay = algorithm(cfg.algorithm).source == REPLAY.name
        self.intake: SampleIntake | ReplayIntake = SampleIntake(
            run_chunk_layout(config, self.spec),
            SampleQueue(cfg.sample_queue, self.local_envs, cfg.staleness_cap), self.rejects)
        """Replaced by a ReplayIntake in setup() when the algorithm learns from replay."""
        self.saves = SaveSchedule(config.checkpoint)
        self.lag_sum = 0.0
        self.lag_count = 0
        # Start time in ms, the `incarnation` its parameter messages carry: a restarted
        # learner's parameters win over its predecessor's.
        self.started_ms = time.time_ns() // 1_000_000
        self.time_update = 0.0
        self.time_put = 0.0
        self.train_metrics: dict[str, float] = {}
        self._next: tuple[Batch, dict[str, np.ndarray]] | None = None
        """The next batch, on the mesh, and the host arrays its bookkeeping needs."""
        self._stop_requested = False
        self._last_batch_wall = time.time()
        # Built by setup():
        self.pull: zmq.Socket | None = None
        self.pub: zmq.Socket | None = None
        self.publisher: ParamPublisher | None = None
        """Only process 0 publishes."""
        self.pool: PoolPublisher | None = None
        """Process 0's opponent pool, when frozen policies play this one (self-play)."""
        self.checkpointer: Checkpointer | None = None
        self.learner: Learner | None = None
        self.control: zmq.Socket | None = None
        """A population member's: where the population manager's exploits arrive."""

    @property
    def version(self) -> int:
        return self.learner.version if self.learner is not None else 0

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        self._join_processes()
        if self.from_replay:
            self._connect_replay()
        else:
            self.pull = make_socket(self.zmq, SAMPLES.bind_type,
                                    hwm=self.config.learner.sample_queue)
            self.transport.bind(self.pull, self.names, self.samples_key)
        if self.processes.is_chief:
            self.pub = make_socket(self.zmq, PARAMS.bind_type, hwm=self.config.learner.param_queue)
            self.transport.bind(self.pub, self.names, PARAMS.key(self.policy))
            self.publisher = ParamPublisher(self.pub, self.started_ms, self.log)
            if self.policy in self.config.selfplay.opponents.values():
                self.pool = self._pool_publisher()
        ckpt = self.config.checkpoint
        if ckpt.enabled:
            self.checkpointer = Checkpointer(self.run_dir, ckpt.keep, ckpt.keep_best,
                                             ckpt.async_save, self.policy, ckpt.dir)
        with self.busy("building the train state and compiling the update"):
            self.learner = build_learner(self.config, self.spec, self.local_envs,
                                         self.checkpointer)
            self._start_hyperparams()
            self._restore()
        mesh = self.learner.mesh
        self.log.info("%s on %d device(s): %s; hyperparameters %s",
                      self.config.learner.algorithm, mesh.size,
                      [str(d) for d in mesh.devices.flat], self.learner.hyperparams())
        if self.config.population.members and self.config.population.exploit:
            self.control = make_socket(self.zmq, CONTROL.bind_type)
            self.transport.bind(self.control, self.names, CONTROL.key(self.policy))
        self._publish()
        if self.pool is not None:
            self.pool.start(self.version, self.learner.params)

    def _pool_publisher(self) -> PoolPublisher:
        """The opponent pool, saved beside the checkpoints (in memory only without them)."""
        selfplay, ckpt = self.config.selfplay, self.config.checkpoint
        directory = pool_root(self.run_dir, self.policy, ckpt.dir) if ckpt.enabled else None
        socket = make_socket(self.zmq, POOL.bind_type, hwm=self.config.learner.param_queue)
        self.transport.bind(socket, self.names, POOL.key(self.policy))
        return PoolPublisher(socket, SnapshotPool(selfplay.snapshot_every, selfplay.pool,
                                                  directory),
                             self.started_ms, self.config.learner.republish_interval_s, self.log)

    def _start_hyperparams(self) -> None:
        """A population member starts from its own values; a checkpoint's win over them."""
        if self.config.population.members:
            start = initial_hyperparams(self.config)[self.policy]
            self.learner.set_hyperparams({field_name(k): v for k, v in start.items()})

    def _take_exploits(self) -> None:
        """Answer the population manager's exploits (see `_exploit`)."""
        while (received := receive(self.control, CONTROL.binder_receives, self.rejects,
                                   envelope=1)) is not None:
            routing, message = received
            reply = {"member": self.policy, **self._exploit(message.meta)}
            send(self.control, "exploited", reply, routing=routing)

    def _exploit(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Copy the donor member's newest complete checkpoint (weights, optimizer state,
        observation statistics) into this learner, keeping its own version count and
        counters, and take the new hyperparameters; no restart, no recompile.

        The copy is checkpointed, and only once that checkpoint is complete does this
        learner append the event to `population.jsonl`: the lineage then never lists a
        copy that a restart or a resume would not bring back, nor misses one it would,
        even when the run stops before the manager hears the answer.
        """
        donor, values, old = meta.get("donor"), meta.get("hyperparams"), meta.get("old_hyperparams")
        scores = meta.get("scores")
        members = member_names(self.config.population.members)
        if donor not in members or donor == self.policy or \
                not (_numbers(values) and _numbers(old) and _numbers(scores, missing=True)) or \
                not {field_name(str(k)) for k in values} <= set(self.learner.hyperparams()):
            self.rejects.reject(ValueError(f"exploit with donor {donor!r}, values {values!r}"))
            return {"ok": False, "reason": "malformed exploit"}
        try:
            restored = self.checkpointer.restore_from(donor, self.learner.state)
            if restored is None:
                return {"ok": False, "reason": f"{donor} has no complete checkpoint yet"}
        except (OSError, ValueError) as error:
            return {"ok": False, "reason": f"cannot copy {donor}: {error}"}
        self.learner.adopt(restored.state)
        self.learner.set_hyperparams({field_name(k): float(v) for k, v in values.items()})
        self.log.info("copied %s's step %d as version %d; hyperparameters %s", donor,
                      restored.step, self.version, self.learner.hyperparams())
        self._publish()
        self._save()
        self.checkpointer.wait()
        append_lineage(self.run_dir, {
            "time": time.time(), "member": self.policy, "donor": donor,
            "donor_step": restored.step, "version": self.version,
            "old_hyperparams": old, "hyperparams": values, "scores": scores})
        return {"ok": True, "donor_step": restored.step, "version": self.version,
                "hyperparams": values}

    def _connect_replay(self) -> None:
        """A socket to each of the policy's replay servers, and the intake over them."""
        servers = self.config.replay.count
        keys = [REPLAY.key(self.policy, i) for i in range(servers)]
        sockets = []
        for key in keys:
            socket = make_socket(self.zmq, REPLAY.connect_type)
            self.connect_to(socket, key)
            sockets.append(socket)
        algo = algorithm(self.config.learner.algorithm)
        window = algo.replay_window(algorithm_config(self.config))
        rows = self.local_envs // servers
        self.intake = ReplayIntake(sockets, keys, rows, window,
                                   replay_layout(rows, window, self.spec), self.rejects)

    def _join_processes(self) -> None:
        """Start jax.distributed with the other learner processes, if there are any."""
        layout = self.processes
        if layout.count > 1 and not layout.coordinator:
            if layout.is_chief:
                address = free_address(coordinator_host(self.config, self.transport.advertise_host))
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
        """Continue from the newest complete checkpoint of this run, if there is one.

        The first start of a new run has none of its own: steps found then belong to
        another run (a `checkpoint.dir` reused, on a host the launcher cannot see), and
        training on from them would mix two runs, so the run is refused.
        """
        meta = self.learner.restore()
        if meta is None:
            return
        if self.incarnation == FIRST:
            raise ConfigError(
                f"'checkpoint.dir' ({self.config.checkpoint.dir or 'the run directory'}) "
                f"already holds checkpoints (step {self.version}) of another run; resume "
                "that run with --resume, or give this one an empty checkpoint.dir")
        self.saves.saved_step = self.version
        counters = restored_counters(meta["processes"], self.processes)
        self.intake.restore(counters, meta.get("recent_returns", []))
        self.lag_sum, self.lag_count = float(counters["lag_sum"]), int(counters["lag_count"])
        self.log.info("restored checkpoint step %d (saved %s)", self.version,
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta["saved_at"])))

    def _carried(self) -> dict[str, float]:
        """The counters in `srl_jax.runtime.metrics.CARRIED`: they belong to the run and are
        checkpointed with the state."""
        return {**self.intake.counters(), "lag_sum": self.lag_sum, "lag_count": self.lag_count}

    def _save(self) -> None:
        """Checkpoint the state as of now (every learner process takes part)."""
        if self.checkpointer is None or not self.saves.needed(self.version):
            return
        per_process = [self._carried()]
        if self.processes.count > 1:
            per_process = gather_json(per_process[0])
        returns = list(self.intake.recent_returns)
        meta = {
            "version": self.version, "saved_at": time.time(), "processes": per_process,
            "recent_returns": returns, "config": config_to_dict(self.config),
            **({"episode_return_mean": float(np.mean(returns))} if returns else {}),
        }
        stall = self.learner.save(meta)
        self.saves.saved(self.version, stall)
        self.log.info("checkpoint step %d started (training held up %.3fs)", self.version, stall)

    def finish(self) -> None:
        """A final checkpoint on a clean stop, waited for."""
        if self.checkpointer is not None:
            self._save()
            start = time.perf_counter()
            self.checkpointer.wait()
            self.log.info("final checkpoint step %d written (waited %.2fs)", self.version,
                          time.perf_counter() - start)

    def run_once(self) -> None:
        if self.control is not None:
            self._take_exploits()
        if self.pool is not None:
            self.pool.republish()
        timeout = 0 if self._next is not None else POLL_MS
        if isinstance(self.intake, ReplayIntake):
            self.intake.pump(timeout)
        elif self.pull.poll(timeout):
            self.intake.drain(self.pull, self.version)
        if self._next is None:
            self._next = self._prefetch()
        ready = self._next is not None
        save = self.checkpointer is not None and self.saves.due(self.version)
        if self.processes.count > 1:
            ready, stop, save = agree(ready, self._stop_requested, save)
            if stop:
                super().request_stop()
                return
        if save:
            self._save()
        if ready:
            self._train()
        elif self.publisher is not None and \
                self.publisher.republish_due(self.config.learner.republish_interval_s):
            self._publish()

    def request_stop(self, *args: Any) -> None:
        """With several learner processes, stop together (see `agree`), never alone."""
        if self.processes.count > 1 and self.learner is not None:
            self._stop_requested = True
        else:
            super().request_stop(*args)

    def _prefetch(self) -> tuple[Batch, dict[str, np.ndarray]] | None:
        """The next batch, already on its way to the devices, with its versions (fresh
        samples) or where its rows came from (replay)."""
        if isinstance(self.intake, ReplayIntake):
            batch = self.intake.take_batch()
            kept = ROUTING
        else:
            batch = self.intake.take_batch(self.version)
            kept = ("versions",)
        if batch is None:
            return None
        start = time.perf_counter()
        on_mesh = self.learner.put(batch)
        self.time_put += time.perf_counter() - start
        return on_mesh, {name: batch[name] for name in kept}

    def _train(self) -> None:
        batch, host = self._next
        self._last_batch_wall = time.time()
        if "versions" in host:
            lag = self.version - host["versions"]
            self.lag_sum += float(lag.sum())
            self.lag_count += lag.size
        start = time.perf_counter()

        def prefetch() -> None:  # overlaps the transfer with the running update
            self._next = self._prefetch()

        with self.busy("updating"):
            metrics = self.learner.step(batch, overlap=prefetch)
        self.time_update += time.perf_counter() - start
        if PER_ROW in metrics:
            self._send_priorities(host, metrics.pop(PER_ROW))
        self.train_metrics = metrics
        if self.learner.version % self.config.learner.publish_every_updates == 0:
            self._publish()
        if self.pool is not None:
            self.pool.keep(self.version, self.learner.params)

    def _send_priorities(self, routing: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        """This process's rows of the (global) batch's new priorities, to their servers."""
        local = len(routing["shards"])
        start = self.processes.index * local if len(priorities) > local else 0
        self.intake.send_priorities(routing, priorities[start:start + local])

    def _publish(self) -> None:
        if self.publisher is not None:
            self.publisher.publish(self.learner.params, self.version)

    def waiting(self) -> tuple[str, float] | None:
        """Samples, while the queue holds less than a batch."""
        if self._next is None and self.learner is not None:
            if isinstance(self.intake, ReplayIntake):
                return self.intake.waiting_on(), self._last_batch_wall
            return (f"samples on {self.samples_key} ({len(self.intake.queue)} chunks queued)",
                    self._last_batch_wall)
        return super().waiting()

    def counters(self) -> dict[str, float]:
        return {
            "learner_steps": self.version, "policy_version": self.version,
            **self._carried(),
            "queue_chunks": self.intake.queued,
            "checkpoints_saved": self.saves.saves,
            "checkpoint_step": self.saves.saved_step if self.saves.saved_step is not None
            else -1,
            "time_checkpoint": self.saves.time_stalled, "time_update": self.time_update,
            "time_put": self.time_put,
            "time_publish": self.publisher.time_publish if self.publisher is not None else 0.0,
            **{f"train/{k}": v for k, v in self.train_metrics.items()},
            **(device_memory_counters(self.learner.mesh.local_devices)
               if self.learner is not None else {}),
            **({f"train/hp/{k}": v for k, v in self.learner.hyperparams().items()}
               if self.learner is not None else {}),
        }

    def close(self) -> None:
        replay = [s.socket for s in self.intake.servers] \
            if isinstance(self.intake, ReplayIntake) else []
        pool = [self.pool.socket] if self.pool is not None else []
        for socket in (self.pull, self.pub, self.control, *replay, *pool):
            if socket is not None:
                socket.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        shutdown(self.processes)


def _numbers(values: Any, missing: bool = False) -> bool:
    """Whether `values` maps names to finite numbers (or None, where `missing`)."""
    return isinstance(values, dict) and all(
        (missing and v is None) or (isinstance(v, int | float) and math.isfinite(v))
        for v in values.values())
