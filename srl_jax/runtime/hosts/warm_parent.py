"""The warm parent: one process per host that has imported JAX, flax, optax, orbax and the
learner side once, without initialising any JAX backend, and forks the host's JAX workers
(learners, inference servers, evaluators, replay servers) on request, so that none of them
pays those imports again (about a CPU-second each on a small machine).

`python -m srl_jax.runtime.hosts.warm_parent --address NAME` serves on a Unix socket in
Linux's abstract namespace (nothing on disk, one per network namespace). Its clients (the
local backend's controller, or each Ray worker host of a node) ask it for a fork with one
JSON message per request on a SOCK_SEQPACKET socket, never a pickle:

- `{"op": "fork", "id", "args", "env", "log"}`: `args` is the worker's command line after the
  interpreter (`-m srl_jax.worker ...`), `env` its whole environment, `log` the file its
  output goes to. Answered by `{"op": "forked", "id", "pid"}` with a pidfd of the child
  attached, or `{"op": "refused", "id", "reason"}` where forking is not safe (the parent has
  a second thread: a fork copies only the calling thread, and a lock another one held stays
  held for good in the child); the client then starts a fresh interpreter instead.
- `{"op": "exited", "pid", "code"}`: the parent reaped a child it forked for this client.

A child watches the client that asked for it (a pidfd of the client, inherited), not the
warm parent: a killed warm parent loses no worker, and the client starts a new one for its
next fork. The warm parent exits once its last client has gone.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import setproctitle

from srl_jax.runtime.hosts import fork_setup

log = logging.getLogger("warm_parent")

PRELOAD = ("jax", "flax.linen", "optax", "orbax.checkpoint", "srl_jax.worker")
"""What the warm parent imports before its first fork, besides its kinds' worker modules."""
IMPORTED = "imported in"
"""How its log line that says what its imports cost begins (bench/startup.py reads it)."""
MAX_MESSAGE = 1 << 20
"""The largest request: a worker's whole environment, as JSON."""
LISTEN_BACKLOG = 64


@dataclass
class Client:
    """One connection: the process that asks for forks."""

    connection: socket.socket
    pidfd: int
    """The client process's pidfd: its children inherit it and stop once it is readable."""


def thread_count() -> int:
    """Every thread of this process, native ones too (the kernel's count, not Python's)."""
    return len(os.listdir("/proc/self/task"))


def fork_refusal() -> str | None:
    """Why this process must not fork now (a second thread), or None."""
    threads = thread_count()
    if threads == 1:
        return None
    named = ", ".join(sorted(t.name for t in threading.enumerate()))
    return (f"the warm parent has {threads} threads (Python's: {named}); a forked child "
            "would inherit the locks they hold")


class Forked(BaseException):
    """Raised in a child just forked, out of the serving loop to `main`, which runs the
    worker: so that it exits as a fresh interpreter would (its non-daemon threads joined,
    atexit handlers run, output flushed), with none of the server's frames beneath it."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: str,
                 parent_pidfd: int) -> None:
        super().__init__(" ".join(args))
        self.command, self.env, self.log_path = args, env, log_path
        self.parent_pidfd = parent_pidfd


class WarmParentServer:
    """The serving loop: accepts clients, forks for them, reaps and reports exits."""

    def __init__(self, address: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind("\0" + address)
        self.listener.listen(LISTEN_BACKLOG)
        self.clients: dict[int, Client] = {}
        self.owner: dict[int, Client] = {}
        """Each live child's client, by pid."""
        self.had_client = False
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self._wake_write)

    def serve(self) -> None:
        """Until the last client has gone (or none came within a minute of the start)."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        while self.clients or not self.had_client:
            events = poller.poll(None if self.had_client else 60_000)
            if not events and not self.had_client:
                log.warning("no client came within a minute; exiting")
                return
            for fd, _ in events:
                if fd == self.listener.fileno():
                    self._accept(poller)
                elif fd == self._wake_read:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_read, 4096)
                    self._reap()
                else:
                    self._serve_client(poller, self.clients[fd])
        self._reap()

    def _accept(self, poller: select.poll) -> None:
        connection, _ = self.listener.accept()
        pid = socket_peer_pid(connection)
        client = Client(connection, os.pidfd_open(pid))
        self.clients[connection.fileno()] = client
        self.had_client = True
        poller.register(connection, select.POLLIN)
        log.info("client pid %d connected", pid)

    def _serve_client(self, poller: select.poll, client: Client) -> None:
        try:
            data = client.connection.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            poller.unregister(client.connection)
            del self.clients[client.connection.fileno()]
            client.connection.close()
            os.close(client.pidfd)
            log.info("a client left (%d remain)", len(self.clients))
            return
        try:
            request = json.loads(data)
            args, env, log_path = list(request["args"]), dict(request["env"]), request["log"]
            request_id = request["id"]
        except (ValueError, KeyError, TypeError) as error:
            log.warning("dropped a malformed request: %s", error)
            return
        reason = fork_refusal()
        if reason is not None:
            log.warning("refused to fork %s: %s", " ".join(args), reason)
            self._send(client, {"op": "refused", "id": request_id, "reason": reason})
            return
        pid = os.fork()
        if pid == 0:
            self._drop(client)
            raise Forked(args, env, log_path, client.pidfd)
        pidfd = os.pidfd_open(pid)
        self.owner[pid] = client
        self._send(client, {"op": "forked", "id": request_id, "pid": pid}, pidfd)
        os.close(pidfd)

    def _drop(self, client: Client) -> None:
        """In a child just forked: let go of the server's sockets and signal handlers, keeping
        the pidfd of `client`, which the worker watches."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        for other in self.clients.values():
            other.connection.close()
            if other.pidfd != client.pidfd:
                os.close(other.pidfd)
        self.listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            client = self.owner.pop(pid, None)
            if client is not None and client.connection.fileno() in self.clients:
                self._send(client, {"op": "exited", "pid": pid, "code": code})

    def _send(self, client: Client, message: dict[str, Any], fd: int | None = None) -> None:
        data = json.dumps(message).encode()
        with contextlib.suppress(OSError):  # a client gone: its leave comes next
            if fd is None:
                client.connection.send(data)
            else:
                socket.send_fds(client.connection, [data], [fd])


def socket_peer_pid(connection: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (the kernel's word)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(credentials[:4], sys.byteorder)


def preload(modules: list[str]) -> None:
    """Import what every forked worker needs, and touch no backend (jax has none yet)."""
    for module in [*PRELOAD, *modules]:
        importlib.import_module(module)
    setproctitle.getproctitle()  # finds argv's memory now, before a child's env moves it
    if thread_count() != 1:
        log.warning("%s", fork_refusal())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fork a host's JAX workers from one "
                                     "process that has imported JAX")
    parser.add_argument("--address", required=True,
                        help="its Unix socket's name in the abstract namespace")
    parser.add_argument("--preload", default="",
                        help="comma-separated modules to import besides JAX's and the "
                        "worker kinds' (tests)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s warm_parent %(levelname)s: %(message)s")
    try:
        server = WarmParentServer(args.address)
    except OSError as error:  # another client of the host started one first
        log.info("not serving at %s: %s", args.address, error)
        return 0
    extra = [name for name in args.preload.split(",") if name]
    preload([*fork_setup.worker_modules(), *extra])
    log.info("%s %.2f CPU-s; serving at %s", IMPORTED, time.process_time(), args.address)
    try:
        server.serve()
        return 0
    except Forked as forked:
        child = forked.with_traceback(None)  # the server's frames go
    return fork_setup.run_forked(child.command, child.env, child.log_path, child.parent_pidfd)


if __name__ == "__main__":
    sys.exit(main())
