"""Launch backends: how the controller starts, watches and stops worker processes.

The controller only needs the small `LaunchBackend` interface. The local
backend runs each worker as its own Python process on this machine: a fresh
interpreter (`python -m srl_jax.worker`) for an actor, a fork of the host's warm
parent (srl_jax/runtime/hosts/warm_parent.py, which has imported JAX) for the kinds
forked warm (`WorkerKind.warm`: learners, inference servers, ...); the Ray backend
(srl_jax/runtime/ray_backend.py) places each worker on a node, whose agent (one Ray actor
a node) starts it there the same way (forked by that node's warm parent where the kind is
warm).
`srl_jax.launch` picks one (`--backend`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.worker_kinds import PARENT_ENV, worker_kind
from srl_jax.runtime.hosts.warm_client import START_TIMEOUT_S, WarmChild, WarmParent
from srl_jax.runtime.name_server import NAMES_ENV
from srl_jax.wire.names import FileNameService, NameService, worker_name
from srl_jax.wire.shm import place as shm_place
from srl_jax.wire.shm.place import OWNER_ENV

log = logging.getLogger(__name__)

APART_ENV = "SRL_JAX_APART"
"""For tests and drills of hosts that share no disk, on one machine: point it at a
directory, and a worker that has a folder there named after it (`population-0`) starts
as if on a host of its own: its `--run-dir` is that folder's `scratch/`, and its
launcher's output goes to the folder's `launcher.log`. Only with the network name
service (`runtime.names: network`), where a worker needs nothing of the run directory."""


class BackendError(RuntimeError):
    """The backend cannot start a worker (e.g. no node has the resources it asks for)."""


@dataclass
class WorkerHandle:
    kind: str
    index: int
    pid: int
    host: str
    ref: Any
    """The backend's hold on the process: a Popen, or where a Ray node's agent keeps it."""
    policy: str = DEFAULT_POLICY
    lost: str | None = None
    """Set by `exit_code` where the worker went with its host (its node left the
    cluster, or its node's agent died), not by a fault of its own: why."""


class LaunchBackend(Protocol):
    def name_service(self) -> NameService:
        """Where workers of this backend register and find endpoints."""

    def bind_host(self) -> str | None:
        """The address the controller binds, where the backend decides (None: the config's)."""

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY,
              env: dict[str, str] | None = None) -> WorkerHandle | None:
        """Start one worker (of `policy`: learners and inference servers) with `env` added
        to its environment; returns once the process exists, or None while no host has
        room for it yet (the request stands: call again with the same worker)."""

    def placement_wait(self, kind: str) -> str:
        """What a worker of `kind` that `start` could not place yet waits for."""

    def ports(self) -> list[dict[str, Any]]:
        """The ports the backend itself listens on (a local Ray instance), as
        `Transport.port_list` lists them."""

    def shared_memory_dir(self) -> str | None:
        """The directory of its workers' shared memory (None: they use none)."""

    def warm_parents(self) -> list[dict[str, Any]]:
        """The warm parents its workers were forked from (srl_jax/runtime/hosts/warm_parent.py):
        each one's host, pid, starts and forks."""

    def exit_code(self, handle: WorkerHandle) -> int | None:
        """The worker's exit code, or None while it runs."""

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        """Deliver `sig` to the worker (ignored if it is gone)."""

    def close(self) -> None:
        """Release what the backend holds (after every worker has exited)."""


def worker_args(kind: str, index: int, run_dir: Path, policy: str) -> list[str]:
    """The worker's command line after the interpreter."""
    return ["-m", "srl_jax.worker", kind, str(index), "--run-dir", str(run_dir),
            "--policy", policy]


Process = subprocess.Popen | WarmChild
"""A worker process as a backend holds it: started, or forked warm (the same interface)."""


def worker_env(env: Mapping[str, str], shared_memory: Path | None) -> dict[str, str]:
    """A worker's whole environment: `env`, this process as its starter, and
    `shared_memory`, the directory of this process's that owns the worker's shared memory
    and removes it (srl_jax/wire/shm/place.py): without it the worker gets no owner,
    whatever `env` says."""
    env = {name: value for name, value in env.items() if name != OWNER_ENV}
    own = {OWNER_ENV: str(shared_memory)} if shared_memory is not None else {}
    return {**env, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid()), **own}


def spawn_worker(args: list[str], env: dict[str, str], log_path: Path,
                 shared_memory: Path | None = None, warm: WarmParent | None = None) -> Process:
    """Start `python args...` in its own session, appending its output to `log_path`
    (made where missing: a host that shares no run directory has none): forked by `warm`
    where given (and it forks), else a fresh interpreter. `shared_memory`: `worker_env`'s."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = worker_env(env, shared_memory)
    forked = warm.fork(args, env, log_path) if warm is not None else None
    return forked if forked is not None else start_fresh(args, env, log_path)


def start_fresh(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """`python args...` in a fresh interpreter of its own session, with exactly `env`."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, *args], stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def warm_address(run: str) -> str:
    """The abstract Unix socket name of a run's warm parent on a host."""
    return f"srl_jax-warm-{os.getuid()}-{run}"


def apart_folder(name: str, env: Mapping[str, str]) -> Path | None:
    """Worker `name`'s folder under APART_ENV, where it has one and `env` (its own) has the
    network name service; None otherwise."""
    root = env.get(APART_ENV)
    folder = Path(root) / name if root and NAMES_ENV in env else None
    return folder if folder is not None and folder.is_dir() else None


class LocalBackend:
    """One process per worker on this machine; logs to `<run_dir>/logs/<worker>.log`.
    With `warm_parent`, the kinds forked warm are forked by this host's warm parent for the
    run, started with the backend (`logs/warm_parent.log`), and again where it died.
    With `shared_memory` (srl_jax/dataflow/shm_budget.py decides) it owns their shared
    memory: it removes what runs gone before it left, makes its own directory when it
    starts its first worker, and removes it when it closes (srl_jax/wire/shm/place.py)."""

    def __init__(self, run_dir: Path, shared_memory: bool = True,
                 warm_parent: bool = False) -> None:
        """`warm_parent`: fork the kinds forked warm from a warm parent, started now, so
        that its imports overlap the controller's start (else each starts fresh)."""
        self.shared_memory: shm_place.OwnerDirectory | None = None
        self._make_shared_memory = shared_memory
        if shared_memory:
            for path in shm_place.sweep_stale():
                log.info("removed shared memory of an earlier run: %s", path)
        self.run_dir = Path(run_dir)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._names = FileNameService(self.run_dir / "names")
        self.warm: WarmParent | None = None
        if warm_parent:
            self.warm = WarmParent(warm_address(secrets.token_hex(8)),
                                   self.run_dir / "logs" / "warm_parent.log", os.environ)
            self.warm.connect()
        self._forking: dict[str, tuple[Any, list[str], dict[str, str], Path]] = {}
        """Each worker whose fork was asked for and not yet answered: (what `request`
        returned, its command line, environment and log)."""

    def name_service(self) -> NameService:
        return self._names

    def bind_host(self) -> str | None:
        return None

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY,
              env: dict[str, str] | None = None) -> WorkerHandle | None:
        """None while its warm parent has not answered yet (it imports JAX first)."""
        name, env = worker_name(kind, index, policy), {**os.environ, **(env or {})}
        run_dir, log_path = self.run_dir, self.run_dir / "logs" / f"{name}.log"
        if (apart := apart_folder(name, env)) is not None:
            run_dir, log_path = apart / "scratch", apart / "launcher.log"
        if self._make_shared_memory:
            self._make_shared_memory = False
            try:
                self.shared_memory = shm_place.OwnerDirectory()
            except OSError as error:
                log.warning("no shared memory for this run (%s): ZeroMQ carries its "
                            "same-host streams", error)
        owner = self.shared_memory.path if self.shared_memory is not None else None
        args, env = worker_args(kind, index, run_dir, policy), worker_env(env, owner)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        process = self._fork(self.warm, name, args, env, log_path) \
            if self.warm is not None and worker_kind(kind).warm \
            else start_fresh(args, env, log_path)
        if process is None:
            return None
        return WorkerHandle(kind, index, process.pid, socket.gethostname(), process, policy)

    def _fork(self, warm: WarmParent, name: str, args: list[str], env: dict[str, str],
              log_path: Path) -> Process | None:
        """The worker forked by `warm` (a fresh interpreter where it refused), or None
        while its answer has not come."""
        if name not in self._forking:
            self._forking[name] = warm.request(args, env, log_path), args, env, log_path
        asked, args, env, log_path = self._forking[name]
        answer = warm.answer(asked)
        if answer is None:
            return None
        del self._forking[name]
        return answer if isinstance(answer, WarmChild) else start_fresh(args, env, log_path)

    def placement_wait(self, kind: str) -> str:
        if self.warm is not None and worker_kind(kind).warm:
            return "the warm parent's fork (it imports JAX once, for every worker it forks)"
        return "nothing: a local process starts at once"

    def ports(self) -> list[dict[str, Any]]:
        return []

    def shared_memory_dir(self) -> str | None:
        return str(self.shared_memory.path) if self.shared_memory is not None else None

    def warm_parents(self) -> list[dict[str, Any]]:
        described = self.warm.describe() if self.warm is not None else None
        return [{"host": socket.gethostname(), **described}] if described else []

    def exit_code(self, handle: WorkerHandle) -> int | None:
        return handle.ref.poll()

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        if handle.ref.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                handle.ref.send_signal(sig)

    def close(self) -> None:
        """Every worker process has been waited for: their shared memory goes, and the warm
        parent with its last client. A fork still unanswered is stopped once it comes."""
        if self.warm is not None:  # forks are asked of it alone
            for asked, *_ in self._forking.values():
                answer = self.warm.answer(asked, START_TIMEOUT_S)
                if isinstance(answer, WarmChild):
                    answer.send_signal(signal.SIGTERM)
                    answer.wait()
            self._forking.clear()
            self.warm.close()
        if self.shared_memory is not None:
            self.shared_memory.remove()
