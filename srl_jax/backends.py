"""Launch backends: how the controller starts, watches and stops worker processes.

The controller only needs the small `LaunchBackend` interface; the local
backend runs each worker as its own Python process on this machine
(`python -m srl_jax.worker`, a fresh interpreter: nothing is forked from a
process that imported JAX). A cluster backend implements the same interface.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from srl_jax.config import DEFAULT_POLICY
from srl_jax.names import FileNameService, NameService, worker_name


@dataclass
class WorkerHandle:
    kind: str
    index: int
    pid: int
    host: str
    process: subprocess.Popen
    policy: str = DEFAULT_POLICY


class LaunchBackend(Protocol):
    def name_service(self) -> NameService:
        """Where workers of this backend register and find endpoints."""

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY) -> WorkerHandle:
        """Start one worker (of `policy`: learners and inference servers); returns at once."""

    def exit_code(self, handle: WorkerHandle) -> int | None:
        """The worker's exit code, or None while it runs."""

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        """Deliver `sig` to the worker (ignored if it is gone)."""


class LocalBackend:
    """One process per worker on this machine; logs to `<run_dir>/logs/<worker>.log`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._names = FileNameService(self.run_dir / "names")

    def name_service(self) -> NameService:
        return self._names

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY) -> WorkerHandle:
        log_path = self.run_dir / "logs" / f"{worker_name(kind, index, policy)}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "srl_jax.worker", kind, str(index),
                 "--run-dir", str(self.run_dir), "--policy", policy],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        return WorkerHandle(kind, index, process.pid, socket.gethostname(), process, policy)

    def exit_code(self, handle: WorkerHandle) -> int | None:
        return handle.process.poll()

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        if handle.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, sig)


def make_backend(name: str, run_dir: Path) -> LaunchBackend:
    if name == "local":
        return LocalBackend(run_dir)
    raise ValueError(f"unknown backend '{name}'")

