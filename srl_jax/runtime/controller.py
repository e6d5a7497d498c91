"""The controller: starts the workers, watches them, keeps the metrics, ends the run.

It binds the stats stream, starts every worker through a launch backend, and
then loops: take heartbeats, restart what died or went silent (bounded retries
with backoff), write a metrics row and `status.json` every log interval, and
stop everything at the stop condition, on SIGINT/SIGTERM, or when a worker
fails for good. A learner that dies is restarted too when checkpoints are on:
it restores the newest checkpoint, while actors and inference servers carry
on with the parameters they have. A worker the backend cannot place yet (no
Ray node has room) waits for one while the run goes on without it (status.json
`missing`); a worker lost with its host is placed again at once, not counted
against `runtime.max_restarts`. On stop the learner gets time to write a
final checkpoint, and a last metrics row records where the run ended, which
is where a `--resume` continues.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from srl_jax.config.env_families import family_of
from srl_jax.config.placement import Placement
from srl_jax.config.run_dir import policy_version, write_status
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ExperimentConfig,
    member_names,
    run_policies,
)
from srl_jax.core.incarnation import Incarnation
from srl_jax.core.metrics_table import DEVICE_MEMORY
from srl_jax.core.names import NameService, worker_name
from srl_jax.core.stream_table import COORDINATOR, STATS
from srl_jax.core.streams import (
    RejectCounter,
    limit_message_size,
    make_socket,
    receive,
)
from srl_jax.core.transport import KEYS_ENV, CurveKeys, Transport
from srl_jax.core.worker_kinds import EXIT_REFUSED, worker_kind, worker_plan
from srl_jax.runtime.backends import BackendError, LaunchBackend, WorkerHandle
from srl_jax.runtime.log_stream import LogSink
from srl_jax.runtime.metrics import MetricsAggregator, MetricsWriter, ProgressDisplay
from srl_jax.runtime.name_server import NAMES_ENV, NameServer
from srl_jax.runtime.startup import StartupTimeline

log = logging.getLogger("controller")

MAX_PORTS = 64
PORT_FIELDS = {"key": str, "endpoint": str, "bind": str, "authenticated": bool}
LOOP_S = 0.05
UNPLACED = ("unplaced", "waiting for capacity")
"""States of a worker that waits for a host with room (`_wait_for_placement`)."""
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class WorkerRecord:
    kind: str
    index: int
    policy: str = DEFAULT_POLICY
    handle: WorkerHandle | None = None
    state: str = "starting"
    restarts: int = 0
    started_at: float = 0.0
    last_heartbeat: float | None = None
    last_heartbeat_wall: float | None = None
    reported: bool = False
    """Whether this process has sent counters yet (heartbeats during setup carry none)."""
    waiting: tuple[str, float] | None = None
    """What its last heartbeat said it waits on, and since when (wall time)."""
    restart_at: float | None = None
    exit_code: int | None = None
    unplaced_since: float | None = None
    """Since when (wall time) it waits for the backend to place it, while it does."""
    losses: int = 0
    """Of its restarts, those after its host was lost (not counted by max_restarts)."""
    ports: list[dict[str, Any]] = field(default_factory=list)
    """The ports its process listens on, as its heartbeats list them."""

    @property
    def name(self) -> str:
        return worker_name(self.kind, self.index, self.policy)


def _waiting(value: Any) -> tuple[str, float] | None:
    """A heartbeat's `waiting` field, [what, since], if it is one."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], int | float) and not isinstance(value[1], bool):
        return value[0], float(value[1])
    return None


def _ports(value: Any) -> list[dict[str, Any]] | None:
    """A heartbeat's `ports` field, if it is a list of ports (see transport.Port)."""
    if isinstance(value, list) and len(value) <= MAX_PORTS and all(
            isinstance(port, dict) and port.keys() == PORT_FIELDS.keys()
            and all(type(port[k]) is t for k, t in PORT_FIELDS.items()) for port in value):
        return value
    return None


def _heartbeat_problem(counters: dict, arrays: dict[str, Any]) -> str | None:
    """Why the metrics cannot take a heartbeat's counters and arrays, or None."""
    if not all(isinstance(key, str) for key in counters):
        return "counter names must be strings"
    if any(array.ndim != 1 for array in arrays.values()):
        return "heartbeat arrays must be one-dimensional"
    returns, lengths = arrays.get("episode_return"), arrays.get("episode_length")
    if (returns is None) != (lengths is None) or (
            returns is not None and len(returns) != len(lengths)):
        return "episode_return and episode_length must come together, of one length"
    return None


class Controller:
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
        if resume_row:  # shown until the restored learners report their own
            for policy in run_policies(config):
                version = policy_version(last, policy)
                self.metrics.observe(worker_name("learner", 0, policy), "learner", {
                    "learner_steps": version, "policy_version": version,
                    "samples_dropped_stale": last.get("samples_dropped_stale", 0)}, {},
                    policy=policy)
        self.rejects = RejectCounter()
        self.workers = [WorkerRecord(kind, index, policy)
                        for kind, index, policy in worker_plan(config)]
        self.stop_reason: str | None = None
        self.exit_code = EXIT_OK
        self.started = time.monotonic()
        self._progress: tuple[int, int] | None = None
        self._progress_at = self._next_stall_log = self.started
        self.started_wall = time.time()
        self.startup = StartupTimeline(launched or self.started_wall)
        self._policy_latest: dict[str, dict[str, float]] = {}
        """Each policy's (population member's) latest value of each stop metric, by metric."""

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._finish(f"interrupted by {signal.Signals(signum).name}", EXIT_INTERRUPTED)

    def _finish(self, reason: str, code: int) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.exit_code = reason, code

    def run(self) -> int:
        """Run until the stop condition; returns the process exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        context = zmq.Context.instance()
        limit_message_size(context, self.config.runtime.max_message_mb)
        transport = self.config.transport
        self.transport = Transport(context, self.backend.bind_host() or transport.bind_host,
                                   transport.advertise_host, self.keys)
        if self.network_names:
            self.name_server = NameServer(self.transport,
                                          (self.run_dir / "config.yaml").read_text())
            self.names = self.name_server
            self.log_sink = LogSink(self.transport, self.names, self.run_dir / "logs",
                                    [record.name for record in self.workers])
        self.stats = make_socket(context, STATS.bind_type, hwm=self.config.runtime.stats_queue)
        self.transport.bind(self.stats, self.names, STATS.key())
        self.writer = MetricsWriter(self.run_dir)
        try:
            for record in self.workers:
                self._start(record)
            self._loop()
        except BackendError as error:
            self._finish(str(error), EXIT_FAILED)
        finally:
            self._shutdown()
            self.stats.close()
            for service in (self.log_sink, self.name_server):
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

    def _start(self, record: WorkerRecord) -> None:
        """Start `record`'s worker, telling it which incarnation it is (its seeds differ)."""
        env = worker_kind(record.kind).start_env(os.environ)
        if self.placement is not None:
            env.update(self.placement.env(record.name))
        env.update(Incarnation(self.resumes, record.restarts).to_env())
        if self.keys:
            env[KEYS_ENV] = self.keys.to_env()
        if self.name_server is not None:
            env[NAMES_ENV] = self.name_server.endpoint
        handle = self.backend.start(record.kind, record.index, record.policy, env)
        if handle is None:
            self._wait_for_placement(record)
            return
        record.handle, record.unplaced_since = handle, None
        self.startup.mark(record.name, "spawned")
        record.state, record.started_at = "starting", time.monotonic()
        record.last_heartbeat = record.restart_at = record.exit_code = None
        record.reported, record.waiting, record.ports = False, None, []
        log.info("started %s (pid %d)", record.name, record.handle.pid)

    def _wait_for_placement(self, record: WorkerRecord) -> None:
        """A worker no host has room for yet: 'unplaced', then past
        `ray.placement_timeout_s` 'waiting for capacity' while the run goes on without
        it, placed as soon as a host has room; a learner not placed by then ends the run."""
        now = time.time()
        if record.unplaced_since is None:
            record.handle, record.state, record.unplaced_since = None, "unplaced", now
            record.waiting = (f"placement: {self.backend.placement_wait(record.kind)}", now)
            return
        timeout = self.config.ray.placement_timeout_s
        if record.state != "unplaced" or now - record.unplaced_since < timeout:
            return
        wait = self.backend.placement_wait(record.kind)
        if worker_kind(record.kind).saves_state:
            record.state = "failed"
            self._finish(f"{record.name} was not placed in {timeout:g}s: {wait}", EXIT_FAILED)
            return
        record.state = "waiting for capacity"
        log.warning("%s was not placed in %.0fs (%s); the run goes on without it until a "
                    "host has room", record.name, timeout, wait)
        self._write_status()

    def _loop(self) -> None:
        next_row = self.started + self.config.runtime.log_interval_s
        while self.stop_reason is None:
            self._take_heartbeats()
            self._watch_workers()
            now = time.monotonic()
            if now >= next_row:
                next_row += self.config.runtime.log_interval_s
                self._write_row()
            time.sleep(LOOP_S)

    def _take_heartbeats(self) -> None:
        by_name = {r.name: r for r in self.workers}
        while (received := receive(self.stats, STATS.binder_receives, self.rejects)) is not None:
            meta, arrays = received[1].meta, received[1].arrays
            worker, counters = meta.get("worker"), meta.get("counters")
            record = by_name.get(worker) if isinstance(worker, str) else None
            if record is None or record.handle is None or meta.get("pid") != record.handle.pid \
                    or not isinstance(counters, dict):
                continue  # a late heartbeat from a replaced process, or garbage
            if problem := _heartbeat_problem(counters, arrays):
                self.rejects.reject(ValueError(f"heartbeat of {record.name}: {problem}"))
                continue
            record.last_heartbeat, record.last_heartbeat_wall = time.monotonic(), time.time()
            record.waiting = _waiting(meta.get("waiting"))
            record.ports = _ports(meta.get("ports")) or record.ports
            self.startup.mark(record.name, "heard")
            if meta.get("phase") == "setup":
                continue  # alive, but its counters are not restored yet
            if record.state == "starting":
                record.state = "running"
                self.startup.mark(record.name, "running")
            progress = counters.get(worker_kind(record.kind).progress)
            if isinstance(progress, int | float) and progress > 0:
                self.startup.first_frame()
            self.metrics.observe(record.name, record.kind, counters, arrays,
                                 first=not record.reported, policy=record.policy)
            record.reported = True

    def _watch_workers(self) -> None:
        now = time.monotonic()
        timeout = self.config.runtime.heartbeat_timeout_s
        for record in self.workers:
            if record.state == "restarting":
                if now >= record.restart_at:
                    self._start(record)
                continue
            if record.state in UNPLACED:
                self._start(record)
                continue
            if record.state in ("failed", "stopped") or record.handle is None:
                continue
            code = self.backend.exit_code(record.handle)
            if code is not None:
                self._on_exit(record, code, f"exited with code {code}")
                continue
            last = record.last_heartbeat or record.started_at
            allowed = timeout if record.last_heartbeat else 2 * timeout
            if now - last > allowed:
                log.warning("no heartbeat from %s for %.0fs; killing it", record.name, now - last)
                self.backend.send_signal(record.handle, signal.SIGKILL)

    def _restartable(self, record: WorkerRecord) -> bool:
        """Stateless kinds always; one that saves its state when it has checkpoints to come
        back from."""
        return not worker_kind(record.kind).saves_state or self.config.checkpoint.enabled

    def _on_exit(self, record: WorkerRecord, code: int, what: str) -> None:
        record.exit_code = code
        lost = record.handle.lost
        if lost:
            what = f"was lost with its host: {lost}"
        self.metrics.retire(record.name)
        log_path = self.run_dir / "logs" / f"{record.name}.log"
        kind = worker_kind(record.kind)
        if kind.process_group and kind.count(self.config) > 1:
            self._stop_process_group(record)
        refused = code == EXIT_REFUSED and not lost
        if refused:
            what = "refused the run (a restart would refuse it again)"
        if refused or not self._restartable(record):
            record.state = "failed"
            self._finish(f"{record.name} {what}; see {log_path}", EXIT_FAILED)
            return
        faults = record.restarts - record.losses
        if not lost and faults >= self.config.runtime.max_restarts:
            record.state = "failed"
            self._finish(f"{record.name} {what} after {record.restarts} restarts; see {log_path}",
                         EXIT_FAILED)
            return
        delay = 0.0 if lost else self.config.runtime.restart_backoff_s * 2 ** faults
        record.restarts += 1
        record.losses += bool(lost)
        self.metrics.restarts += 1
        self.metrics.learner_restarts += record.kind == "learner"
        record.state, record.restart_at = "restarting", time.monotonic() + delay
        log.warning("%s %s; restart %d in %.1fs", record.name, what, record.restarts, delay)
        self._write_status()

    def _stop_process_group(self, record: WorkerRecord) -> None:
        """A policy's learner processes share one jax.distributed job: one gone means
        all restart.

        The others are killed (their collectives would wait forever) and come back
        through `_on_exit` like the first; the stale coordinator address goes.
        """
        self.names.unregister(COORDINATOR.key(record.policy))
        for other in self.workers:
            if other.kind == record.kind and other.policy == record.policy \
                    and other.handle is not None and other.state in ("starting", "running") \
                    and self.backend.exit_code(other.handle) is None:
                log.warning("%s leaves with the learner group", other.name)
                self.backend.send_signal(other.handle, signal.SIGKILL)

    def _elapsed(self) -> float:
        return self.time_base + time.monotonic() - self.started

    def _write_row(self, check_stop: bool = True) -> None:
        row = self.metrics.row(self._elapsed())
        row["system/resumes"] = self.resumes
        row["system/wire_rejected"] = row.get("system/wire_rejected", 0) + self.rejects.count \
            + sum(service.rejects.count for service in (self.name_server, self.log_sink)
                  if service is not None)
        row["system/auth_refused"] = row.get("system/auth_refused", 0) + self.transport.refused
        row["system/workers_missing"] = len(self._missing())
        self.writer.write(row)
        self.progress.show(row)
        self._watch_progress(row)
        self._write_status()
        if check_stop:
            self._check_stop(row)

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
                            self._describe(r) for r in self.workers))

    @staticmethod
    def _describe(record: WorkerRecord) -> str:
        """`actor-0 (running, heartbeat 0.4s ago) waits 61s on an inference reply ...`."""
        now = time.time()
        seen = "no heartbeat yet" if record.last_heartbeat_wall is None else \
            f"heartbeat {now - record.last_heartbeat_wall:.1f}s ago"
        text = f"{record.name} ({record.state}, {seen})"
        if record.waiting is not None:
            what, since = record.waiting
            text += f" waits {now - since:.0f}s on {what}"
        return text

    def _target_policies(self) -> tuple[list[str], str] | None:
        """Whose own returns the targets read, and how the stop reason names them: a
        population's members, or a multi-agent run's trained policies (`stop.policy` alone when
        set); None: the run's one return (`episode_return_mean`, `eval_return_mean`)."""
        if members := member_names(self.config.population.members):
            return members, "every member's"
        if not family_of(self.config.env).multi_agent:
            return None
        if (chosen := self.config.stop.policy) is not None:
            return [chosen], f"policy {chosen}'s"
        return run_policies(self.config), "every trained policy's"  # frozen ones only act

    def _lowest(self, row: dict[str, Any], metric: str, names: list[str]) -> float:
        """Progress of policies `names` in `metric`: the lowest of their latest
        `policy/<name>/<metric>` (-inf until every one has one)."""
        latest = self._policy_latest.setdefault(metric, {})
        for name in names:
            if (key := f"policy/{name}/{metric}") in row:
                latest[name] = row[key]
        if len(latest) < len(names):
            return -float("inf")
        return min(latest.values())

    def _policy_target(self, row: dict[str, Any], names: list[str], whose: str) -> str | None:
        """Why a run ends on a target that policies `names` read with their own returns
        (or evaluation returns): each one's reached it."""
        stop = self.config.stop
        for metric, target in (("episode_return_mean", stop.target_return),
                               ("eval_return_mean", stop.target_eval_return)):
            if target is not None and (lowest := self._lowest(row, metric, names)) >= target:
                figure = f"lowest {lowest:.1f}" if len(names) > 1 else f"{lowest:.1f}"
                return (f"{whose} {metric} reached the target {target:g} ({figure}) at "
                        f"{row['env_frames']} frames, {row['time']:.1f}s")
        return None

    def _check_stop(self, row: dict[str, Any]) -> None:
        stop = self.config.stop
        targets = self._target_policies()
        if targets is not None and (reason := self._policy_target(row, *targets)):
            self._finish(reason, EXIT_OK)
        elif targets is None and stop.target_return is not None and row.get(
                "episode_return_mean", -float("inf")) >= stop.target_return:
            self._finish(f"episode_return_mean {row['episode_return_mean']:.1f} reached the "
                         f"target {stop.target_return:g} at {row['env_frames']} frames, "
                         f"{row['time']:.1f}s", EXIT_OK)
        elif targets is None and stop.target_eval_return is not None and row.get(
                "eval_return_mean", -float("inf")) >= stop.target_eval_return:
            self._finish(f"eval_return_mean {row['eval_return_mean']:.1f} of version "
                         f"{row['eval_policy_version']} reached the target "
                         f"{stop.target_eval_return:g} at {row['env_frames']} frames, "
                         f"{row['time']:.1f}s", EXIT_OK)
        elif stop.env_frames and row["env_frames"] >= stop.env_frames:
            self._finish(f"{row['env_frames']} env frames reached the limit {stop.env_frames}",
                         EXIT_OK)
        elif stop.wall_time_s and row["time"] >= stop.wall_time_s:
            self._finish(f"wall time {row['time']:.0f}s reached the limit {stop.wall_time_s:g}s",
                         EXIT_OK)

    def _missing(self) -> list[str]:
        """The workers that wait for a host with room, so the run goes on without them."""
        return [r.name for r in self.workers if r.state in UNPLACED]

    def _write_status(self, state: str = "running") -> None:
        status = {
            "experiment": self.config.name, "run_dir": str(self.run_dir), "state": state,
            "stop_reason": self.stop_reason, "controller_pid": os.getpid(),
            "started": self.started_wall, "updated": time.time(), "resumes": self.resumes,
            "stalled_for": round(self._stalled_for(), 1),
            "startup": self.startup.to_json(),
            "ports": self.transport.port_list() + self.backend.ports(),
            "missing": self._missing(),
            "workers": [{
                "name": r.name, "kind": r.kind, "index": r.index, "policy": r.policy,
                "pid": r.handle.pid if r.handle else None,
                "host": r.handle.host if r.handle else None, "state": r.state,
                "restarts": r.restarts, "last_heartbeat": r.last_heartbeat_wall,
                "exit_code": r.exit_code, "unplaced_since": r.unplaced_since,
                "waiting_on": r.waiting[0] if r.waiting else None,
                "waiting_since": r.waiting[1] if r.waiting else None,
                "ports": r.ports,
                **self._device_status(r.name),
            } for r in self.workers],
        }
        if self.placement is not None:
            status["placement"] = self.placement.to_json()
        write_status(self.run_dir, status)

    def _device_status(self, name: str) -> dict[str, Any]:
        """The worker's place (platform, devices, memory share) and the device memory
        its heartbeats last reported, where the platform gives it."""
        status: dict[str, Any] = {}
        if self.placement is not None and name in self.placement.workers:
            placed = self.placement.workers[name]
            status = {"platform": placed.platform, "devices": list(placed.devices),
                      "memory_share": placed.memory}
        counters = self.metrics.live.get(name, {})
        status.update({key: counters[key] for key in DEVICE_MEMORY if key in counters})
        return status

    def _grace_s(self, record: WorkerRecord) -> float:
        """How long a worker may take to exit after SIGTERM (the learner saves first)."""
        grace = self.config.runtime.stop_grace_s
        if worker_kind(record.kind).saves_state and self.config.checkpoint.enabled:
            grace += self.config.checkpoint.final_save_timeout_s
        return grace

    def _shutdown(self) -> None:
        """SIGTERM every live worker, wait for its grace period, then SIGKILL.

        A last metrics row then records the final counters, as of the learner's
        final checkpoint.
        """
        if self.stop_reason is None:
            self._finish("controller error", EXIT_FAILED)
        live = [r for r in self.workers if r.handle and self.backend.exit_code(r.handle) is None]
        for record in live:
            self.backend.send_signal(record.handle, signal.SIGTERM)
        started = time.monotonic()
        while any(self.backend.exit_code(r.handle) is None
                  and time.monotonic() - started < self._grace_s(r) for r in live):
            self._take_heartbeats()
            time.sleep(LOOP_S)
        for record in live:
            if self.backend.exit_code(record.handle) is None:
                log.warning("%s did not stop in %.0fs; killing it", record.name,
                            self._grace_s(record))
                self.backend.send_signal(record.handle, signal.SIGKILL)
                while self.backend.exit_code(record.handle) is None:
                    time.sleep(LOOP_S)
            if record.state != "failed":
                record.state = "stopped"
                record.exit_code = self.backend.exit_code(record.handle)
        self._take_heartbeats()
        self._write_row(check_stop=False)
        final = {EXIT_OK: "finished", EXIT_INTERRUPTED: "interrupted"}
        self._write_status(final.get(self.exit_code, "failed"))
