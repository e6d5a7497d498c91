"""A worker as the controller sees it: its process, state and restarts, and what its last
heartbeat said (when it came, what it waits on, the ports it listens on).

The supervisor (srl_jax/runtime/supervisor.py) moves a record through its states, the
controller fills it from heartbeats, and each record writes its own line of status.json.
A heartbeat's fields come from another process: they are checked here before they are
kept, and a malformed one is dropped.

Here too, the start-up timeline: where the seconds between the command and the first env
frame go. The controller marks, in seconds since the launcher started, when it came up,
when each worker's first process was spawned, first heard from (its imports done, the
stats stream connected), and running (its setup done: sockets bound, programs compiled),
and when the first env frame of the run was reported. `status.json` keeps it as
`startup`; bench/e2e_fps.py reports it. Restarts leave it alone: it is about getting
going.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.runtime.backends import WorkerHandle
from srl_jax.wire.names import worker_name

MAX_PORTS = 64
PORT_FIELDS = {"key": str, "endpoint": str, "bind": str, "authenticated": bool}
UNPLACED = ("unplaced", "waiting for capacity")
"""States of a worker that waits for a host with room (srl_jax/runtime/supervisor.py)."""


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
    """Of its restarts, those after a host was lost: its own, or that of a peer in its
    process group, which took it down (not counted by max_restarts)."""
    ports: list[dict[str, Any]] = field(default_factory=list)
    """The ports its process listens on, as its heartbeats list them."""

    @property
    def name(self) -> str:
        return worker_name(self.kind, self.index, self.policy)

    @property
    def process(self) -> WorkerHandle:
        """The handle of a worker started at least once (one the supervisor watches)."""
        if self.handle is None:
            raise ValueError(f"{self.name} has not been started")
        return self.handle

    def describe(self) -> str:
        """`actor-0 (running, heartbeat 0.4s ago) waits 61s on an inference reply ...`."""
        now = time.time()
        seen = "no heartbeat yet" if self.last_heartbeat_wall is None else \
            f"heartbeat {now - self.last_heartbeat_wall:.1f}s ago"
        text = f"{self.name} ({self.state}, {seen})"
        if self.waiting is not None:
            what, since = self.waiting
            text += f" waits {now - since:.0f}s on {what}"
        return text

    def status(self) -> dict[str, Any]:
        """Its entry in status.json's `workers`."""
        return {
            "name": self.name, "kind": self.kind, "index": self.index, "policy": self.policy,
            "pid": self.handle.pid if self.handle else None,
            "host": self.handle.host if self.handle else None, "state": self.state,
            "restarts": self.restarts, "last_heartbeat": self.last_heartbeat_wall,
            "exit_code": self.exit_code, "unplaced_since": self.unplaced_since,
            "waiting_on": self.waiting[0] if self.waiting else None,
            "waiting_since": self.waiting[1] if self.waiting else None,
            "ports": self.ports,
        }

    def heard(self, meta: dict[str, Any], now: float, wall: float) -> None:
        """A heartbeat came (at `now` monotonic, `wall` wall time: read once per message):
        what it waits on, and its ports (kept if it lists none)."""
        self.last_heartbeat, self.last_heartbeat_wall = now, wall
        self.waiting = waiting_field(meta.get("waiting"))
        self.ports = ports_field(meta.get("ports")) or self.ports


def take_signs(records: Mapping[str, WorkerRecord], signs: list[list[Any]], now: float,
               wall: float) -> None:
    """Signs of life (`host_agent.signs_of_life`: [worker, pid, since or None]) into their
    workers' records, heard at `now` and `wall`, in one loop with no call per sign: a host
    agent sends one for most heartbeats. A sign of a process its record no longer has (a
    replaced one) is left out. What a worker waits on is as its last whole heartbeat said
    (the agent sends one whole when that changes); a sign moves its `since`."""
    for worker, pid, since in signs:
        record = records.get(worker)
        if record is None or record.handle is None or record.handle.pid != pid:
            continue
        record.last_heartbeat, record.last_heartbeat_wall = now, wall
        if since is not None and record.waiting is not None:
            record.waiting = (record.waiting[0], float(since))


def waiting_field(value: Any) -> tuple[str, float] | None:
    """A heartbeat's `waiting` field, [what, since], if it is one."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], int | float) and not isinstance(value[1], bool):
        return value[0], float(value[1])
    return None


def ports_field(value: Any) -> list[dict[str, Any]] | None:
    """A heartbeat's `ports` field, if it is a list of ports (see transport.Port)."""
    if isinstance(value, list) and len(value) <= MAX_PORTS and all(
            isinstance(port, dict) and port.keys() == PORT_FIELDS.keys()
            and all(type(port[k]) is t for k, t in PORT_FIELDS.items()) for port in value):
        return value
    return None


def heartbeat_problem(counters: dict, arrays: dict[str, Any]) -> str | None:
    """Why the metrics cannot take a heartbeat's counters and arrays, or None."""
    if not all(map(isinstance, counters, repeat(str))):  # no Python call per counter
        return "counter names must be strings"
    if any(array.ndim != 1 for array in arrays.values()):
        return "heartbeat arrays must be one-dimensional"
    returns, lengths = arrays.get("episode_return"), arrays.get("episode_length")
    if (returns is None) != (lengths is None) or (
            returns is not None and lengths is not None and len(returns) != len(lengths)):
        return "episode_return and episode_length must come together, of one length"
    return None


EVENTS = ("spawned", "heard", "running")
"""A worker's start-up steps, in order."""


FIRSTS = {"env_frames": "first_frame_s", "learner_steps": "first_update_s"}
"""The startup events the progress counters' first rises are (status.json `startup`)."""


class StartupTimeline:
    def __init__(self, launched: float) -> None:
        """`launched`: wall time (time.time()) when the launcher started."""
        self.launched = launched
        self.controller_s = self._since()
        self.firsts: dict[str, float] = {}
        """When each progress counter (`WorkerKind.progress`) first rose, by its event."""
        self.workers: dict[str, dict[str, float]] = {}

    def _since(self) -> float:
        return round(time.time() - self.launched, 3)

    def mark(self, worker: str, event: str) -> None:
        """`worker` reached `event` (one of EVENTS); only the first time counts."""
        marks = self.workers.setdefault(worker, {})
        if (key := f"{event}_s") not in marks:  # asked on every heartbeat: cheap when known
            marks[key] = self._since()

    def first(self, counter: str) -> None:
        """A worker reported progress on `counter` (env frames, updates): the run's first
        frame or update, where it is the first report (FIRSTS names the event)."""
        event = FIRSTS.get(counter, f"first_{counter}_s")
        if event not in self.firsts:
            self.firsts[event] = self._since()

    @property
    def first_frame_s(self) -> float | None:
        return self.firsts.get(FIRSTS["env_frames"])

    def to_json(self) -> dict[str, Any]:
        return {"launched": self.launched, "controller_s": self.controller_s,
                **{event: self.firsts.get(event) for event in FIRSTS.values()},
                "workers": self.workers}
