"""Supervision: start the run's workers and keep them going until the run stops.

A worker that exits or goes silent is restarted with exponential backoff, up to
`runtime.max_restarts` times. A learner that dies is restarted too when checkpoints are
on: it restores the newest checkpoint, while actors and inference servers carry on with
the parameters they have. One that refuses the run (EXIT_REFUSED) ends it with its
reason. A worker the backend cannot place yet (no Ray node has room) waits for one
while the run goes on without it; a worker lost with its host is placed again at once,
not counted against `runtime.max_restarts`. At the end every worker gets SIGTERM and its
grace period (a learner: time for its final checkpoint), then SIGKILL; the heartbeat a
worker sends last, as it exits, may still be on its way when its exit is seen, and is
waited for.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.stream_table import COORDINATOR
from srl_jax.dataflow.worker_kinds import EXIT_REFUSED, worker_kind
from srl_jax.runtime.backends import LaunchBackend
from srl_jax.runtime.incarnation import Incarnation
from srl_jax.runtime.metrics import MetricsAggregator
from srl_jax.runtime.placement import Placement
from srl_jax.runtime.worker_base import STACKS_SIGNAL
from srl_jax.runtime.worker_records import UNPLACED, StartupTimeline, WorkerRecord
from srl_jax.wire.names import NameService

log = logging.getLogger("controller")

LOOP_S = 0.05
WATCHED_PER_TURN = 256
"""Workers whose exit and silence one `watch` looks at, at least: a large run's records
are looked at in turns (every record within WATCH_ROUND_S), so that a turn's cost does
not grow with the workers (a process's exit status is a system call or a Ray wait)."""
WATCH_ROUND_S = 0.5
LAST_HEARTBEAT_S = 2.0
"""How long the end of a run waits for the last heartbeats of workers that exited cleanly."""
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


class Supervisor:
    """Moves each worker record through its states: starting, running, restarting,
    unplaced or waiting for capacity, failed, stopped. The controller reads what it found
    (`failure`, `status_due`) after each turn."""

    def __init__(self, config: ExperimentConfig, run_dir: Path, backend: LaunchBackend,
                 workers: list[WorkerRecord], metrics: MetricsAggregator,
                 startup: StartupTimeline, names: NameService,
                 placement: Placement | None = None, resumes: int = 0) -> None:
        """`names`: where the run's workers register (a stopped process group's
        coordinator is taken out); `placement`, `resumes`: what each worker's environment
        says of its place and of the run's resumes (`worker_env`)."""
        self.config = config
        self.run_dir = run_dir
        self.backend = backend
        self.workers = workers
        self.metrics = metrics
        self.startup = startup
        self.names = names
        self.placement = placement
        self.resumes = resumes
        self.run_env: dict[str, str] = {}
        """What every worker starts with (the run's CURVE keys, the name server's address)."""
        self.failure: str | None = None
        """Why the run must end, once a worker failed for good."""
        self.status_due = False
        """A record changed in a way status.json should show now."""
        self._next_watched = 0
        self._stacks_asked = False
        self._taken_down: dict[str, str] = {}
        """Workers killed with a process group whose member was lost with its host: by
        name, that member's."""
        self._hosts_silent: dict[str, float] = {}
        """When each host whose workers all went silent was found so (`_host_silent`)."""
        self._per_turn = max(WATCHED_PER_TURN,
                             math.ceil(len(workers) * LOOP_S / WATCH_ROUND_S))

    def start(self, record: WorkerRecord) -> None:
        """Start `record`'s worker (or wait for a place for it)."""
        handle = self.backend.start(record.kind, record.index, record.policy,
                                    self.worker_env(record))
        if handle is None:
            self._place(record)
            return
        record.handle, record.unplaced_since = handle, None
        self.startup.mark(record.name, "spawned")
        record.state, record.started_at = "starting", time.monotonic()
        record.last_heartbeat = record.restart_at = record.exit_code = None
        record.reported, record.waiting, record.ports = False, None, []
        log.info("started %s (pid %d)", record.name, record.handle.pid)

    def worker_env(self, record: WorkerRecord) -> dict[str, str]:
        """What `record`'s worker starts with beside the launcher's environment: its kind's,
        its place's, which incarnation it is (its seeds differ), the run's keys and names."""
        env = worker_kind(record.kind).start_env(os.environ)
        if self.placement is not None:
            env.update(self.placement.env(record.name))
        env.update(Incarnation(self.resumes, record.restarts).to_env())
        return {**env, **self.run_env}

    def _fail(self, record: WorkerRecord, reason: str) -> None:
        record.state = "failed"
        self.failure = self.failure or reason

    def _place(self, record: WorkerRecord) -> None:
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
            self._fail(record, f"{record.name} was not placed in {timeout:g}s: {wait}")
            return
        record.state = "waiting for capacity"
        log.warning("%s was not placed in %.0fs (%s); the run goes on without it until a "
                    "host has room", record.name, timeout, wait)
        self.status_due = True

    def missing(self) -> list[str]:
        """The workers that wait for a host with room, so the run goes on without them."""
        return [r.name for r in self.workers if r.state in UNPLACED]

    def watch(self) -> None:
        """Start what is due to restart or waits for a place; notice exits and silence;
        pass on a request for stacks (`ask_stacks`)."""
        if self._stacks_asked:
            self._stacks_asked = False
            for record in self.workers:
                if record.handle is not None and record.state in ("starting", "running"):
                    self.backend.send_signal(record.handle, STACKS_SIGNAL)
        now = time.monotonic()
        timeout = self.config.runtime.heartbeat_timeout_s
        for record in self._this_turn():
            if record.state == "restarting":
                if now >= (record.restart_at or 0.0):
                    self.start(record)
                continue
            if record.state in UNPLACED:
                self.start(record)
                continue
            if record.state in ("failed", "stopped") or record.handle is None:
                continue
            code = self.backend.exit_code(record.handle)
            if code is not None:
                self.on_exit(record, code, f"exited with code {code}")
                continue
            if overdue(record, now, timeout):
                if self._host_silent(record.handle.host, now, timeout):
                    record.handle.lost = f"every worker on {record.handle.host} went silent " \
                                         "(its host agent or its link, not the workers)"
                log.warning("no heartbeat from %s for %.0fs; killing it", record.name,
                            now - (record.last_heartbeat or record.started_at))
                self.backend.send_signal(record.handle, signal.SIGKILL)

    def _host_silent(self, host: str, now: float, timeout: float) -> bool:
        """Whether every live worker on `host` (two at least) is past its allowed silence:
        then the host's agent or its link went, as a Ray node does, and each worker's
        restart is one preemption, not a fault of its own. Found so, the host stays so for
        a heartbeat timeout, while its workers are killed one turn after another."""
        if now - self._hosts_silent.get(host, -math.inf) < timeout:
            return True
        live = [r for r in self.workers if r.handle is not None and r.handle.host == host
                and r.state in ("starting", "running")]
        if len(live) > 1 and all(overdue(r, now, timeout) for r in live):
            log.warning("every worker on %s went silent: its host agent or its link is down; "
                        "its workers restart as lost with it", host)
            self._hosts_silent[host] = now
            return True
        return False

    def ask_stacks(self, *_: Any) -> None:
        """The controller's SIGUSR1 handler: `status --stacks` asks for the stacks of
        workers it cannot signal itself. The next `watch` has the backend send each live
        worker SIGUSR1 (a Ray call, which a signal handler must not make)."""
        self._stacks_asked = True

    def _this_turn(self) -> list[WorkerRecord]:
        """The records `watch` looks at now: all of them, or the next slice of a large run."""
        if len(self.workers) <= self._per_turn:
            return self.workers
        start = self._next_watched
        self._next_watched = (start + self._per_turn) % len(self.workers)
        return (self.workers + self.workers)[start:start + self._per_turn]

    def _restartable(self, record: WorkerRecord) -> bool:
        """Stateless kinds always; one that saves its state when it has checkpoints to come
        back from."""
        return not worker_kind(record.kind).saves_state or self.config.checkpoint.enabled

    def on_exit(self, record: WorkerRecord, code: int, what: str) -> None:
        """`record`'s process ended with `code`: restart it later, or end the run.

        A host lost is one preemption: the worker lost with it and the peers of its process
        group that go with it (killed here, or ended by themselves once a peer found lost)
        come back at once, none of them counted against `runtime.max_restarts`.
        """
        record.exit_code = code
        lost = record.process.lost
        taken_down = self._taken_down.pop(record.name, None)
        self.metrics.retire(record.name)
        log_path = self.run_dir / "logs" / f"{record.name}.log"
        kind = worker_kind(record.kind)
        if kind.process_group and kind.count(self.config) > 1 and not taken_down:
            # One taken down was stopped with its group, which may have started again since.
            taken_down = self._stop_process_group(record, lost)
        if lost:
            what = f"was lost with its host: {lost}"
        elif taken_down:
            what = f"went with its process group: {taken_down} was lost with its host"
        lost = lost or taken_down
        refused = code == EXIT_REFUSED and not lost
        if refused:
            what = "refused the run (a restart would refuse it again)"
        if refused or not self._restartable(record):
            self._fail(record, f"{record.name} {what}; see {log_path}")
            return
        faults = record.restarts - record.losses
        if not lost and faults >= self.config.runtime.max_restarts:
            self._fail(record, f"{record.name} {what} after {record.restarts} restarts; "
                               f"see {log_path}")
            return
        delay = 0.0 if lost else self.config.runtime.restart_backoff_s * 2 ** faults
        record.restarts += 1
        record.losses += bool(lost)
        self.metrics.restarts += 1
        self.metrics.learner_restarts += record.kind == "learner"
        record.state, record.restart_at = "restarting", time.monotonic() + delay
        log.warning("%s %s; restart %d in %.1fs", record.name, what, record.restarts, delay)
        self.status_due = True

    def _stop_process_group(self, record: WorkerRecord, lost: str | None) -> str | None:
        """A policy's learner processes share one jax.distributed job: one gone means
        all restart.

        The others are killed (their collectives would wait forever) and come back
        through `on_exit` like the first; the stale coordinator address goes. Where a host
        was lost (`record`'s, or a peer's found lost), those it takes down went with it.
        Returns the name of a peer lost with its host, if one was (`record` went with it).
        """
        self.names.unregister(COORDINATOR.key(record.policy))
        peers = [other for other in self.workers if other is not record
                 and other.kind == record.kind and other.policy == record.policy
                 and other.handle is not None and other.state in ("starting", "running")]
        running = [other for other in peers if self.backend.exit_code(other.process) is None]
        peer_lost = next((other.name for other in peers
                          if other not in running and other.process.lost), None)
        cause = record.name if lost else peer_lost
        for other in running:
            log.warning("%s leaves with the learner group", other.name)
            if cause:
                self._taken_down[other.name] = cause
            self.backend.send_signal(other.process, signal.SIGKILL)
        return peer_lost

    def _grace_s(self, record: WorkerRecord) -> float:
        """How long a worker may take to exit after SIGTERM (the learner saves first)."""
        grace = self.config.runtime.stop_grace_s
        if worker_kind(record.kind).saves_state and self.config.checkpoint.enabled:
            grace += self.config.checkpoint.final_save_timeout_s
        return grace

    def stop_all(self, while_waiting: Callable[[], None],
                 sent_last: Callable[[WorkerRecord], bool]) -> None:
        """SIGTERM every live worker, wait for its grace period (calling `while_waiting`
        meanwhile), then SIGKILL; every worker not failed ends 'stopped'. Then, calling
        `while_waiting`, wait until `sent_last(record)` says that each of them that exited
        cleanly after reporting has sent its last heartbeat, for up to `LAST_HEARTBEAT_S`."""
        live = [r for r in self.workers if r.handle and self.backend.exit_code(r.handle) is None]
        for record in live:
            self.backend.send_signal(record.process, signal.SIGTERM)
        started = time.monotonic()
        while any(self.backend.exit_code(r.process) is None
                  and time.monotonic() - started < self._grace_s(r) for r in live):
            while_waiting()
            time.sleep(LOOP_S)
        for record in live:
            if self.backend.exit_code(record.process) is None:
                log.warning("%s did not stop in %.0fs; killing it", record.name,
                            self._grace_s(record))
                self.backend.send_signal(record.process, signal.SIGKILL)
                while self.backend.exit_code(record.process) is None:
                    time.sleep(LOOP_S)
            if record.state != "failed":
                record.state = "stopped"
                record.exit_code = self.backend.exit_code(record.process)
        self._await_last_heartbeats(live, while_waiting, sent_last)

    def _await_last_heartbeats(self, stopped: list[WorkerRecord], while_waiting: Callable[[], None],
                               sent_last: Callable[[WorkerRecord], bool]) -> None:
        deadline = time.monotonic() + LAST_HEARTBEAT_S
        while True:
            while_waiting()
            missing = [r.name for r in stopped if r.state == "stopped" and r.reported
                       and r.exit_code == 0 and not sent_last(r)]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(LOOP_S)
        if missing:
            log.warning("no last heartbeat from %s within %.0fs of its exit: the last metrics "
                        "row lacks what it did since its previous one", ", ".join(missing),
                        LAST_HEARTBEAT_S)


def overdue(record: WorkerRecord, now: float, timeout: float) -> bool:
    """Whether `record`'s worker is silent past `timeout` (`runtime.heartbeat_timeout_s`;
    twice that before its process's first heartbeat)."""
    last = record.last_heartbeat
    return now - (last or record.started_at) > (timeout if last else 2 * timeout)
