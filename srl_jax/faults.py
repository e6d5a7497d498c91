"""Failure injection, for tests and for drills on a real deployment: make chosen
workers raise inside their loop, once each.

Point `SRL_JAX_FAULTS` at a directory (the launcher passes its environment on
to every worker). A file in it named after a worker (`inference-0`,
`learner-red-0`) and holding a number of seconds makes that worker raise
`InjectedFault` from its loop that long after it starts running. The worker
deletes the file first, so its restarted successor runs on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FAULTS_ENV = "SRL_JAX_FAULTS"


class InjectedFault(RuntimeError):
    """Raised by a worker that was told to fail (see the module docstring)."""


class FaultPlan:
    """When (if at all) this worker raises; `check` is called once per loop turn."""

    def __init__(self, worker_name: str) -> None:
        self.due: float | None = None
        directory = os.environ.get(FAULTS_ENV)
        if not directory:
            return
        self.path = Path(directory) / worker_name
        try:
            self.after_s = float(self.path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return
        self.due = time.monotonic() + self.after_s

    def check(self) -> None:
        if self.due is not None and time.monotonic() >= self.due:
            self.due = None
            self.path.unlink(missing_ok=True)
            raise InjectedFault(f"injected by {self.path} after {self.after_s:g}s of running")
