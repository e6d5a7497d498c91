"""The controller: starts the workers, watches them, keeps the metrics, ends the run.

It binds the stats stream, starts every worker through a launch backend, and
then loops: take heartbeats, let the supervisor restart what died or went silent
(srl_jax/runtime/supervisor.py), write a metrics row and `status.json` every log
interval, and stop everything at the stop condition (srl_jax/runtime/stop_rule.py), on
SIGINT/SIGTERM, or when a worker fails for good. On stop the learner gets time to
write a final checkpoint, and a last metrics row records where the run ended, which
is where a `--resume` continues. That row waits for the last heartbeat of every worker
that stopped cleanly (`Supervisor.stop_all`): it carries what finished while the run
stopped (an evaluation, the final checkpoint's step).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from srl_jax.config.schema import ExperimentConfig, run_policies
from srl_jax.dataflow.metrics_table import DEVICE_MEMORY
from srl_jax.dataflow.stream_table import STATS
from srl_jax.dataflow.worker_kinds import worker_kind, worker_plan
from srl_jax.runtime.backends import BackendError, LaunchBackend
from srl_jax.runtime.hosts.host_agent import signs_of_life, unbatch
from srl_jax.runtime.log_stream import LogSink
from srl_jax.runtime.metrics import MetricsAggregator, MetricsWriter, ProgressDisplay
from srl_jax.runtime.name_server import NAMES_ENV, NameServer
from srl_jax.runtime.placement import Placement
from srl_jax.runtime.population_link import PopulationLink, population_link
from srl_jax.runtime.run_dir import policy_version, write_status
from srl_jax.runtime.stop_rule import StopRule
from srl_jax.runtime.supervisor import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    LOOP_S,
    Supervisor,
)
from srl_jax.runtime.worker_base import LAST_PHASE, STACKS_SIGNAL
from srl_jax.runtime.worker_records import (
    StartupTimeline,
    WorkerRecord,
    heartbeat_problem,
    take_signs,
)
from srl_jax.wire.codec import Message
from srl_jax.wire.names import NameService, worker_name
from srl_jax.wire.streams import (
    RejectCounter,
    limit_message_size,
    make_socket,
    receive,
)
from srl_jax.wire.transport import KEYS_ENV, CurveKeys, Transport

log = logging.getLogger("controller")

TAKE_S = 0.2
"""Longest one loop turn takes heartbeats for."""
STATUS_WORKERS = 1000


class Controller:
    """One run: its services (stats, names, logs), its workers' supervisor, metrics and
    status, and its stop rule, in one loop."""

    def __init__(self, config: ExperimentConfig, run_dir: Path, backend: LaunchBackend,
                 progress: ProgressDisplay | None = None,
                 resume_row: dict[str, Any] | None = None, resumed: bool = False,
                 keys: CurveKeys | None = None, placement: Placement | None = None,
                 launched: float | None = None, network_names: bool = False) -> None:
        """`resume_row`: the last metrics row kept by a resume; counters go on from it.
        `keys`: the run's CURVE keys (the backend hands workers the same), None: off.
        `placement`: each worker's devices and the environment that puts it there (None:
        workers start with the launcher's environment alone). `launched`: wall time the
        launcher started, where the start-up timeline counts from (None: now).
        `network_names`: serve names, the config and a log stream to workers over the
        network (srl_jax/runtime/name_server.py, srl_jax/runtime/log_stream.py) rather than
        have them use files in the run directory."""
        self.config = config
        self.network_names = network_names
        self.name_server: NameServer | None = None
        self.log_sink: LogSink | None = None
        self.population_link: PopulationLink | None = None
        self.names: NameService = backend.name_service()
        self.placement = placement
        self.keys = keys
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.progress = progress or ProgressDisplay(sys.stdout, enabled=False)
        last = resume_row or {}
        self.time_base = float(last.get("time", 0.0))
        self.metrics = MetricsAggregator(env_frames_base=last.get("env_frames", 0),
                                         time_base=self.time_base,
                                         restarts=last.get("system/restarts", 0))
        self.resumes = int(last.get("system/resumes", 0)) + int(resumed)
        self.heartbeats = int(last.get("system/heartbeats", 0))
        """Whole heartbeats taken (`system/heartbeats`), a resumed run's included."""
        self.signs_of_life = int(last.get("system/signs_of_life", 0))
        """Host agents' signs of life taken (`system/signs_of_life`)."""
        if resume_row:  # shown until the restored learners report their own
            for policy in run_policies(config):
                self.metrics.observe(worker_name("learner", 0, policy), "learner", {
                    "learner_steps": policy_version(last, policy),
                    "samples_dropped_stale": last.get("samples_dropped_stale", 0)}, {},
                    policy=policy)
        self.rejects = RejectCounter()
        self.workers = [WorkerRecord(kind, index, policy)
                        for kind, index, policy in worker_plan(config)]
        self._by_name = {record.name: record for record in self.workers}
        self.stop_reason: str | None = None
        self.exit_code = EXIT_OK
        self.last_heard: set[tuple[str, int]] = set()
        """(worker, pid) of each process whose last heartbeat (`LAST_PHASE`) came."""
        self.started = time.monotonic()
        self._progress: tuple[int, int] | None = None
        self._progress_at = self._next_stall_log = self._next_status = self.started
        self.started_wall = time.time()
        self.startup = StartupTimeline(launched or self.started_wall)
        self.stop_rule = StopRule(config)
        self.supervisor = Supervisor(config, self.run_dir, backend, self.workers, self.metrics,
                                     self.startup, self.names, placement, self.resumes)
        if keys:
            self.supervisor.run_env[KEYS_ENV] = keys.to_env()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._finish(f"interrupted by {signal.Signals(signum).name}", EXIT_INTERRUPTED)

    def _finish(self, reason: str, code: int) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.exit_code = reason, code

    def run(self) -> int:
        """Run until the stop condition; returns the process exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        previous[STACKS_SIGNAL] = signal.signal(STACKS_SIGNAL, self.supervisor.ask_stacks)
        context: zmq.Context = zmq.Context.instance()
        limit_message_size(context, self.config.runtime.max_message_mb)
        transport = self.config.transport
        self.transport = Transport(context, self.backend.bind_host() or transport.bind_host,
                                   transport.advertise_host, self.keys)
        if self.network_names:
            self.name_server = NameServer(self.transport,
                                          (self.run_dir / "config.yaml").read_text())
            self.names = self.supervisor.names = self.name_server
            self.supervisor.run_env[NAMES_ENV] = self.name_server.endpoint
            self.log_sink = LogSink(self.transport, self.names, self.run_dir / "logs",
                                    [record.name for record in self.workers])
        self.stats = make_socket(context, STATS.bind_type, hwm=self.config.runtime.stats_queue)
        self.transport.bind(self.stats, self.names, STATS.key())
        self.population_link = population_link(self.config, self.transport, self.names,
                                               self.run_dir)
        self.writer = MetricsWriter(
            self.run_dir, self.population_link.publish if self.population_link else None)
        try:
            for record in self.workers:
                self.supervisor.start(record)
            self._loop()
        except BackendError as error:
            self._finish(str(error), EXIT_FAILED)
        finally:
            self._shutdown()
            self.stats.close()
            for service in (self.population_link, self.log_sink, self.name_server):
                if service is not None:
                    service.close()
            self.transport.close()
            self.backend.close()
            self.writer.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        ok = self.exit_code == EXIT_OK
        self.progress.finish(f"{'done' if ok else 'failed'}: {self.stop_reason} "
                             f"(run directory: {self.run_dir})", ok)
        return self.exit_code

    def _loop(self) -> None:
        next_row = self.started + self.config.runtime.log_interval_s
        while self.stop_reason is None:
            self._take_heartbeats()
            self.supervisor.watch()
            if self.supervisor.failure is not None:
                self._finish(self.supervisor.failure, EXIT_FAILED)
            if self.supervisor.status_due:
                self._write_status()
            now = time.monotonic()
            if now >= next_row:
                next_row += self.config.runtime.log_interval_s
                self._write_row()
            time.sleep(LOOP_S)

    def _take_heartbeats(self) -> None:
        """The heartbeats waiting, for up to TAKE_S: a controller behind (thousands of
        workers, or a machine it shares) still supervises, writes rows and stops on time,
        and takes the rest next turn."""
        deadline = time.monotonic() + TAKE_S
        while time.monotonic() < deadline and (received := receive(
                self.stats, STATS.binder_receives, self.rejects)) is not None:
            self._take_message(received[1])

    def _take_message(self, message: Message) -> None:
        """A `stats` message, or a host agent's `stats_batch`: per message, not per entry,
        where it can (one clock read, the signs of life in one loop: take_signs). The signs
        go first: where a burst put a worker's sign and its whole heartbeat in one batch,
        the wait the whole one reports is not given an older wait's since."""
        try:
            beats, (signs, malformed) = unbatch(message), signs_of_life(message)
        except ValueError as error:
            self.rejects.reject(error)
            return
        if malformed:
            self.rejects.reject(ValueError("stats_batch: a malformed sign of life"), malformed)
        now, wall = time.monotonic(), time.time()
        take_signs(self._by_name, signs, now, wall)
        for meta, arrays in beats:
            self._take_heartbeat(meta, arrays, now, wall)
        self.heartbeats += len(beats)
        self.signs_of_life += len(signs)

    def _take_heartbeat(self, meta: dict[str, Any], arrays: dict[str, Any], now: float,
                        wall: float) -> None:
        worker, counters = meta.get("worker"), meta.get("counters")
        if not isinstance(worker, str) or (record := self._by_name.get(worker)) is None \
                or record.handle is None or meta.get("pid") != record.handle.pid \
                or not isinstance(counters, dict):
            return  # a late heartbeat from a replaced process, or garbage
        if problem := heartbeat_problem(counters, arrays):
            self.rejects.reject(ValueError(f"heartbeat of {worker}: {problem}"))
            return
        record.heard(meta, now, wall)
        self.startup.mark(worker, "heard")
        if meta.get("phase") == "setup":
            return  # alive, but its counters are not restored yet
        if meta.get("phase") == LAST_PHASE:
            self.last_heard.add((worker, record.handle.pid))
        if record.state == "starting":
            record.state = "running"
            self.startup.mark(worker, "running")
        counter = worker_kind(record.kind).progress
        if isinstance(progress := counters.get(counter), int | float) and progress > 0:
            self.startup.first(counter)
        self.metrics.offer(worker, record.kind, counters, arrays,
                           first=not record.reported, policy=record.policy)
        record.reported = True

    def _elapsed(self) -> float:
        return self.time_base + time.monotonic() - self.started

    def _write_row(self, check_stop: bool = True) -> None:
        row = self.metrics.row(self._elapsed())
        row["system/resumes"] = self.resumes
        row["system/heartbeats"], row["system/signs_of_life"] = self.heartbeats, \
            self.signs_of_life
        services = (self.name_server, self.log_sink, self.population_link)
        row["system/wire_rejected"] = row.get("system/wire_rejected", 0) + self.rejects.count \
            + sum(service.rejects.count for service in services if service is not None)
        row["system/auth_refused"] = row.get("system/auth_refused", 0) + self.transport.refused
        if self.name_server is not None:
            row["system/name_requests"] = self.name_server.requests
        if self.log_sink is not None:
            row["system/log_errors"] = self.log_sink.errors
        row["system/workers_missing"] = len(self.supervisor.missing())
        self.writer.write(row)
        self.progress.show(row)
        self._watch_progress(row)
        if time.monotonic() >= self._next_status:
            self._take_heartbeats()  # what came while the row was made: status shows it
            self._write_status()
        if check_stop and (reason := self.stop_rule.reason(row)):
            self._finish(reason, EXIT_OK)

    def _stalled_for(self) -> float:
        return time.monotonic() - self._progress_at

    def _watch_progress(self, row: dict[str, Any]) -> None:
        """With no new frames and no learner step for `runtime.stall_timeout_s`, say who
        waits on what (again every as long while it lasts)."""
        progress = (row["env_frames"], row["learner_steps"])
        now = time.monotonic()
        if progress != self._progress:
            self._progress, self._progress_at = progress, now
            return
        timeout = self.config.runtime.stall_timeout_s
        if timeout and self._stalled_for() >= timeout and now >= self._next_stall_log:
            self._next_stall_log = now + timeout
            log.warning("no progress for %.0fs (env frames %d, learner steps %d): %s",
                        self._stalled_for(), *progress, "; ".join(
                            record.describe() for record in self.workers))

    def _write_status(self, state: str = "running") -> None:
        """status.json now; a run of more than STATUS_WORKERS workers rewrites it every
        second per STATUS_WORKERS (10 s for 10,000), not every row: each time it is
        every worker's entry."""
        self.supervisor.status_due = False
        self._next_status = time.monotonic() + self.config.runtime.log_interval_s * max(
            1.0, len(self.workers) / STATUS_WORKERS) - LOOP_S
        status = {
            "experiment": self.config.name, "run_dir": str(self.run_dir), "state": state,
            "stop_reason": self.stop_reason, "controller_pid": os.getpid(),
            "started": self.started_wall, "updated": time.time(), "resumes": self.resumes,
            "stalled_for": round(self._stalled_for(), 1), "missing": self.supervisor.missing(),
            "startup": self.startup.to_json(), "warm_parents": self.backend.warm_parents(),
            "ports": self.transport.port_list() + self.backend.ports(),
            "shared_memory": self.backend.shared_memory_dir(),
            "workers": [{**r.status(), **device_status(r.name, self.placement, self.metrics)}
                        for r in self.workers],
        }
        if self.placement is not None:
            status["placement"] = self.placement.to_json()
        write_status(self.run_dir, status)

    def _shutdown(self) -> None:
        """Stop every worker (a learner first writes its final checkpoint); a last metrics
        row then records the final counters, as of that checkpoint."""
        if self.stop_reason is None:
            self._finish("controller error", EXIT_FAILED)
        self.supervisor.stop_all(self._take_heartbeats,
                                 lambda r: (r.name, r.process.pid) in self.last_heard)
        self._write_row(check_stop=False)
        final = {EXIT_OK: "finished", EXIT_INTERRUPTED: "interrupted"}
        self._write_status(final.get(self.exit_code, "failed"))


def device_status(name: str, placement: Placement | None,
                  metrics: MetricsAggregator) -> dict[str, Any]:
    """A worker's place (platform, devices, memory share) and the device memory its
    heartbeats last reported, where the platform gives it."""
    status: dict[str, Any] = {}
    if placement is not None and name in placement.workers:
        placed = placement.workers[name]
        status = {"platform": placed.platform, "devices": list(placed.devices),
                  "memory_share": placed.memory}
    counters = metrics.live.get(name, {})
    status.update({key: counters[key] for key in DEVICE_MEMORY if key in counters})
    return status
