"""The learner worker: the process around a `Learner` (learners/training/learner.py).

Its intake (learners/intake/intake.py) receives what the algorithm learns from:
chunks on the sample stream, checked against the shapes this run expects and queued
under the staleness cap, or batches of B transitions sampled by the replay servers,
which get each update's new priorities back. Each batch is put onto the learner's
device mesh (split on the env axis) while the previous update still runs, and goes
through one compiled update of the configured algorithm. The parameters are
published as soon as the train state exists (restored, where there is a checkpoint),
before the update compiles, then after each update with the next version number, and
re-sent every `learner.republish_interval_s` so that servers that (re)joined late
catch up.

The learner checkpoints its train state and counters (see
`learners.training.checkpoint`) every `checkpoint.interval_s` and/or
`checkpoint.every_updates`, and once more when told to stop, to `checkpoint.dir`
(`srl_jax.config.checkpoint_location`). At start it restores the newest complete
checkpoint there, if there is one: that is how a killed learner recovers and how
`--resume` continues a run.

The worker is a shell with one part per job: an `Intake` (receive, check, queue),
`Learner` (train state and update), `ParamPublisher`, `SaveSchedule`, `agree` for the
multi-process learner (learners/training/distributed.py), `PopulationMember` in a
population that exploits (learners/population_member.py) and, when frozen
policies play this one's snapshots, `PoolPublisher` (self-play).
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from actors.envs import policy_spec
from learners.algorithms.train_state import Batch
from learners.intake.intake import Intake, open_intake
from learners.pool_publisher import PoolPublisher
from learners.population_member import (
    PopulationMember,
    open_population_member,
    start_hyperparams,
)
from learners.training.checkpoint import Checkpointer, SaveSchedule
from learners.training.collectives import GLOO_KEY, NCCL_KEY, note_new_ports
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
from learners.training.jax_runtime import configure_jax, device_memory_counters
from learners.training.learner import PER_ROW, Learner, build_learner
from policy.param_stream import ParamPublisher
from srl_jax.config.loader import config_to_dict
from srl_jax.config.opponent_pool import SnapshotPool
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, ExperimentConfig
from srl_jax.dataflow.metrics_table import CARRIED
from srl_jax.dataflow.stream_table import COORDINATOR, PARAMS, POOL
from srl_jax.runtime.incarnation import FIRST
from srl_jax.runtime.run_dir import pool_root
from srl_jax.runtime.worker_base import Worker, built
from srl_jax.wire.names import NameService

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


def awaiting_intake(waiting_on: str, last_batch_wall: float) -> tuple[str, float]:
    """What a learner's heartbeat says it waits on: what its intake waits for, since its
    last batch (bench/simulated/swarm_hosts.py sends the same)."""
    return waiting_on, last_batch_wall


class LearnerWorker(Worker):
    kind = "learner"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        self.processes = process_layout(config, index)
        self.local_envs = config.learner.batch_envs // self.processes.count
        self.spec = policy_spec(config, policy)
        self.saves = SaveSchedule(config.checkpoint)
        self.lag_sum = 0.0
        self.lag_count = 0
        # Start time in ms, which its parameter messages carry (`started_ms`): a restarted
        # learner's parameters win over its predecessor's.
        self.started_ms = time.time_ns() // 1_000_000
        self.time_update = 0.0
        self.time_put = 0.0
        self.train_metrics: dict[str, float] = {}
        self._next: tuple[Batch, dict[str, np.ndarray]] | None = None
        """The next batch, on the mesh, and the host arrays the intake keeps of it."""
        self._stop_requested = False
        self._last_batch_wall = time.time()
        self._nccl = False
        """Whether updates run NCCL's collectives (a mesh of several GPUs)."""
        self._updates_here = 0
        """Updates by this process (a restored learner's version starts high)."""
        # Built by setup():
        self._intake: Intake | None = None
        self.publisher: ParamPublisher | None = None
        """Only process 0 publishes."""
        self.pool: PoolPublisher | None = None
        """Process 0's opponent pool, when frozen policies play this one (self-play)."""
        self.checkpointer: Checkpointer | None = None
        self._learner: Learner | None = None
        self.member: PopulationMember | None = None
        """Where the population manager's exploits arrive, in a population that exploits."""

    @property
    def intake(self) -> Intake:
        return built(self._intake, "the intake")

    @property
    def learner(self) -> Learner:
        return built(self._learner, "the learner")

    @property
    def version(self) -> int:
        return self._learner.version if self._learner is not None else 0

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        self.processes = join_processes(self, self.processes)
        self._intake = open_intake(self, self.spec, self.local_envs, self.processes.index)
        if self.processes.is_chief:
            pub = self.socket(PARAMS, hwm=self.config.learner.param_queue)
            self.publisher = ParamPublisher(pub, self.started_ms, self.log)
            if self.policy in self.config.selfplay.opponents.values():
                self.pool = open_pool_publisher(self, self.started_ms)
        ckpt = self.config.checkpoint
        if ckpt.enabled:
            self.checkpointer = Checkpointer(self.run_dir, ckpt.keep, ckpt.keep_best,
                                             ckpt.async_save, self.policy, ckpt.dir)
        with self.busy("building the train state"):
            self._learner = build_learner(self.config, self.spec, self.local_envs,
                                          self.checkpointer)
            start_hyperparams(self.config, self.policy, self.learner)
            self._restore()
        # Published before the update compiles: the inference servers, which build no
        # parameters of their own, act with these meanwhile.
        self._publish()
        if self.pool is not None:
            self.pool.start(self.version, self.learner.params)
        with self.busy("compiling the update"):
            self.learner.compile()
        mesh = self.learner.mesh
        self._nccl = mesh.size > 1 and mesh.devices.flat[0].platform == "gpu"
        self.log.info("%s on %d device(s): %s; hyperparameters %s",
                      self.config.learner.algorithm, mesh.size,
                      [str(d) for d in mesh.devices.flat], self.learner.hyperparams())
        self.member = open_population_member(self, self.learner, self.checkpointer,
                                             self._save_copy)

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
        """The counters in `srl_jax.dataflow.metrics_table.CARRIED`: they belong to the run and
        are checkpointed with the state."""
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

    def _save_copy(self) -> None:
        """A population member's copy of its donor: published, and checkpointed; what its
        own parameters acted (queued, prefetched or still on their way) is dropped."""
        self._next = None
        self.intake.forget_before(self.learner.version)
        self._publish()
        self._save()

    def finish(self) -> None:
        """A final checkpoint on a clean stop, waited for."""
        if self.checkpointer is not None:
            self._save()
            start = time.perf_counter()
            self.checkpointer.wait()
            self.log.info("final checkpoint step %d written (waited %.2fs)", self.version,
                          time.perf_counter() - start)

    def run_once(self) -> None:
        if self.member is not None:
            self.member.answer()
        if self.pool is not None:
            self.pool.republish()
        self.intake.pump(0 if self._next is not None else POLL_MS, self.version)
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
        if self.processes.count > 1 and self._learner is not None:
            self._stop_requested = True
        else:
            super().request_stop(*args)

    def _prefetch(self) -> tuple[Batch, dict[str, np.ndarray]] | None:
        """The next batch, already on its way to the devices, with the host arrays the
        intake keeps of it."""
        batch = self.intake.take_batch(self.version)
        if batch is None:
            return None
        start = time.perf_counter()
        on_mesh = self.learner.put(batch)
        self.time_put += time.perf_counter() - start
        return on_mesh, {name: batch[name] for name in self.intake.kept}

    def _train(self) -> None:
        if self._next is None:  # every process agreed it is ready: this one has a batch
            raise RuntimeError("a training step without a batch")
        batch, kept = self._next
        self._last_batch_wall = time.time()
        if "versions" in kept:
            lag = self.version - kept["versions"]
            self.lag_sum += float(lag.sum())
            self.lag_count += lag.size
        start = time.perf_counter()

        def prefetch() -> None:  # overlaps the transfer with the running update
            self._next = self._prefetch()

        with self.busy("updating"):
            metrics = self.learner.step(batch, overlap=prefetch)
        self.time_update += time.perf_counter() - start
        self.intake.trained(kept, metrics.pop(PER_ROW, None))
        self._updates_here += 1
        if self._nccl and self._updates_here & (self._updates_here - 1) == 0:  # 1, 2, 4, ...
            note_new_ports(self.transport, NCCL_KEY)  # NCCL's sockets come with collectives
        self.train_metrics = metrics
        if self.learner.version % self.config.learner.publish_every_updates == 0:
            self._publish()
        if self.pool is not None:
            self.pool.keep(self.version, self.learner.params)

    def _publish(self) -> None:
        if self.publisher is not None:
            self.publisher.publish(self.learner.params, self.version)

    def waiting(self) -> tuple[str, float] | None:
        """What the intake waits for, while no batch is ready."""
        if self._next is None and self._learner is not None:
            return awaiting_intake(self.intake.waiting_on(), self._last_batch_wall)
        return super().waiting()

    def counters(self) -> dict[str, float]:
        """Nothing before the learner is built: the controller takes a learner's counters
        only after setup, once a checkpoint's are restored."""
        if self._learner is None:
            return {}
        return {
            "learner_steps": self.version,
            **self._carried(),
            "queue_chunks": self.intake.queued,
            **self.shm_counters(),
            "checkpoints_saved": self.saves.saves,
            "checkpoint_step": self.saves.saved_step if self.saves.saved_step is not None
            else -1,
            "time_checkpoint": self.saves.time_stalled, "time_update": self.time_update,
            "time_put": self.time_put,
            "time_publish": self.publisher.time_publish if self.publisher is not None else 0.0,
            **{f"train/{k}": v for k, v in self.train_metrics.items()},
            **device_memory_counters(self.learner.mesh.local_devices),
            **{f"train/hp/{k}": v for k, v in self.learner.hyperparams().items()},
        }

    def close(self) -> None:
        for part in (self._intake, self.member):
            if part is not None:
                part.close()
        for sender in (self.publisher, self.pool):
            if sender is not None:
                sender.socket.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        shutdown(self.processes)


def join_processes(worker: Worker, layout: ProcessLayout) -> ProcessLayout:
    """Start jax.distributed with `worker`'s other learner processes, if there are any;
    returns the layout with the coordinator's address."""
    host = coordinator_host(worker.config, worker.transport.advertise_host)
    key = COORDINATOR.key(worker.policy)
    if layout.count > 1 and not layout.coordinator:
        if layout.is_chief:
            address = free_address(host)
            worker.names.register(key, address)
        else:
            address = worker.lookup(key)
        layout = replace(layout, coordinator=address)
    if layout.count > 1 and layout.is_chief:  # given or picked, process 0 serves it
        worker.transport.note_port(key, layout.coordinator)  # gRPC: no CURVE
    initialize(layout, host)
    if layout.count > 1:
        # jax.distributed installs a preemption notifier on SIGTERM; ours must win.
        signal.signal(signal.SIGTERM, worker.request_stop)
        jax.devices()  # the backends start: gloo listens
        worker.log.info("JAX process %d of %d (coordinator %s, gloo %s)", layout.index,
                        layout.count, layout.coordinator,
                        ", ".join(note_new_ports(worker.transport, GLOO_KEY)))
    return layout


def open_pool_publisher(worker: Worker, started_ms: int) -> PoolPublisher:
    """The opponent pool of `worker`'s policy, saved beside the checkpoints (in memory only
    without them), its socket bound."""
    config = worker.config
    selfplay, ckpt = config.selfplay, config.checkpoint
    directory = pool_root(worker.run_dir, worker.policy, ckpt.dir) if ckpt.enabled else None
    return PoolPublisher(worker.socket(POOL, hwm=config.learner.param_queue),
                         SnapshotPool(selfplay.snapshot_every, selfplay.pool, directory),
                         started_ms, config.learner.republish_interval_s, worker.log)
