"""The worker processes one node's agent keeps (srl_jax/runtime/ray_backend.py `NodeAgent`).

The agent starts each worker as the local backend would (a fresh interpreter, or a fork of
the node's warm parent), under the serial number the controller gave that start, and
reports each exit once. Its workers watch the agent as their parent (`parent_watch`,
srl_jax/runtime/worker_base.py): they stop when it goes, so none outlives the run.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from srl_jax.runtime.backends import Process, spawn_worker
from srl_jax.runtime.hosts.warm_client import WarmParent


class NodeWorkers:
    """The live workers of a node, by the serial number of their start."""

    def __init__(self) -> None:
        self.processes: dict[int, Process] = {}

    def start(self, serial: int, args: list[str], env: dict[str, str], log_path: Path,
              warm: WarmParent | None = None) -> Process:
        """`python args...` with exactly `env` (forked by `warm` where given and it forks)."""
        process = self.processes[serial] = spawn_worker(args, env, log_path, warm=warm)
        return process

    def exits(self) -> dict[int, int]:
        """The exit codes of the workers that ended since the last call, by serial: each
        reported once, then forgotten."""
        ended = {serial: code for serial, process in self.processes.items()
                 if (code := process.poll()) is not None}
        for serial in ended:
            del self.processes[serial]
        return ended

    def signal(self, serial: int, sig: int) -> None:
        """Deliver `sig` to a live worker (ignored where it has ended)."""
        process = self.processes.get(serial)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
