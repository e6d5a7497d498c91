"""Failure injection, for tests and for drills on a real deployment: make chosen
workers raise inside their loop, once each.

Point `SRL_JAX_FAULTS` at a directory (the launcher passes its environment on
to every worker). A file in it named after a worker (`inference-0`,
`learner-red-0`) and holding a number of seconds makes that worker raise
`InjectedFault` from its loop that long after it starts running; a file put
there later, while the worker runs, makes it raise as soon as that time has
passed, so a drill can fail one worker after another. The worker deletes the
file first, so its restarted successor runs on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FAULTS_ENV = "SRL_JAX_FAULTS"
LOOK_EVERY_S = 0.25
"""How often a running worker looks for its file: a loop turn can be microseconds."""


class InjectedFault(RuntimeError):
    """Raised by a worker that was told to fail (see the module docstring)."""


class FaultPlan:
    """When (if at all) this worker raises; `check` is called once per loop turn."""

    def __init__(self, worker_name: str) -> None:
        directory = os.environ.get(FAULTS_ENV)
        self.path = Path(directory) / worker_name if directory else None
        self.started = self.next_look = time.monotonic()

    def check(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + LOOK_EVERY_S
        try:
            after_s = float(self.path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return
        if now - self.started >= after_s:
            self.path.unlink(missing_ok=True)
            raise InjectedFault(
                f"injected by {self.path} after {now - self.started:.1f}s of running")
