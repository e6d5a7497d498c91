"""The start-up timeline: where the seconds between the command and the first env frame go.

The controller marks, in seconds since the launcher started, when it came up, when each
worker's first process was spawned, first heard from (its imports done, the stats stream
connected), and running (its setup done: sockets bound, programs compiled), and when
the first env frame of the run was reported. `status.json` keeps it as `startup`;
bench/e2e_fps.py reports it. Restarts leave it alone: it is about getting going.
"""

from __future__ import annotations

import time
from typing import Any

EVENTS = ("spawned", "heard", "running")
"""A worker's start-up steps, in order."""


class StartupTimeline:
    def __init__(self, launched: float) -> None:
        """`launched`: wall time (time.time()) when the launcher started."""
        self.launched = launched
        self.controller_s = self._since()
        self.first_frame_s: float | None = None
        self.workers: dict[str, dict[str, float]] = {}

    def _since(self) -> float:
        return round(time.time() - self.launched, 3)

    def mark(self, worker: str, event: str) -> None:
        """`worker` reached `event` (one of EVENTS); only the first time counts."""
        marks = self.workers.setdefault(worker, {})
        if (key := f"{event}_s") not in marks:  # asked on every heartbeat: cheap when known
            marks[key] = self._since()

    def first_frame(self) -> None:
        """An actor reported env frames; only the first report counts."""
        if self.first_frame_s is None:
            self.first_frame_s = self._since()

    def to_json(self) -> dict[str, Any]:
        return {"launched": self.launched, "controller_s": self.controller_s,
                "first_frame_s": self.first_frame_s, "workers": self.workers}
