"""A client's hold on its host's warm parent (srl_jax/runtime/hosts/warm_parent.py): the
local backend's, or a Ray worker host's. It starts the warm parent where none serves (and
again after one died), asks it for forks without waiting (`request`, then `answer`), and
holds each child as a backend holds a started process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srl_jax.runtime.hosts import fork_setup, warm_parent
from srl_jax.runtime.hosts.warm_parent import MAX_MESSAGE, socket_peer_pid

log = logging.getLogger(__name__)


UNKNOWN_EXIT = -signal.SIGKILL
"""The exit code reported for a child that outlived its warm parent (whose reaper, init,
keeps no code for us): counted as a failure, as a kill would be."""
UNKNOWN_AFTER_S = 2.0
"""How long a child's exit may wait for its code from a live warm parent."""
START_TIMEOUT_S = 30.0


class WarmChild:
    """A worker forked by a warm parent, held as the backends hold a started one (a Popen's
    `pid`, `poll`, `wait`, `send_signal`): its exit is seen through its pidfd, its code comes
    from the warm parent."""

    def __init__(self, link: _Link, pid: int, pidfd: int) -> None:
        self.link = link
        self.pid = pid
        self.pidfd = pidfd
        self.returncode: int | None = None
        self._exited_at: float | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self.link.drain()
        if self.returncode is None and readable(self.pidfd, 0):
            now = time.monotonic()
            self._exited_at = self._exited_at or now
            if self.link.closed or now - self._exited_at > UNKNOWN_AFTER_S:
                log.warning("worker pid %d exited after its warm parent: exit code unknown",
                            self.pid)
                self.settle(UNKNOWN_EXIT)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            if readable(self.pidfd, 0.05):  # exited: its code is on its way
                self.link.drain(0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, sig)

    def settle(self, code: int) -> None:
        self.returncode = code
        os.close(self.pidfd)


def readable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


class _Link:
    """One connection to one warm parent process, and what was asked and forked over it."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.children: dict[int, WarmChild] = {}
        self.answers: dict[int, WarmChild | str] = {}
        """Each request's answer until taken: its child, or why it was refused."""
        self.asked: dict[int, float] = {}
        """When each request still unanswered was sent (monotonic)."""
        self.closed = False
        self._next_id = 0

    def request(self, args: list[str], env: dict[str, str], log_path: str) -> int:
        self._next_id += 1
        request = {"op": "fork", "id": self._next_id, "args": args, "env": env, "log": log_path}
        self.connection.send(json.dumps(request).encode())
        self.asked[self._next_id] = time.monotonic()
        return self._next_id

    def answer(self, request: int, timeout_s: float = 0.0) -> WarmChild | str | None:
        """The child forked for `request`, the reason it was refused, or None while
        unanswered (an answer past START_TIMEOUT_S, or from a parent gone, is a refusal)."""
        deadline = time.monotonic() + timeout_s
        while request not in self.answers:
            self.drain(max(deadline - time.monotonic(), 0.0))
            if request in self.answers:
                break
            if self.closed:
                return "the warm parent exited before answering"
            if time.monotonic() - self.asked[request] > START_TIMEOUT_S:
                return f"the warm parent did not answer in {START_TIMEOUT_S:g}s"
            if time.monotonic() >= deadline:
                return None
        del self.asked[request]
        return self.answers.pop(request)

    def drain(self, timeout_s: float = 0.0) -> None:
        """Take what has come (waiting up to `timeout_s` for the first message)."""
        while not self.closed and readable(self.connection.fileno(), timeout_s):
            timeout_s = 0.0
            try:
                data, fds, _, _ = socket.recv_fds(self.connection, MAX_MESSAGE, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                self.closed = True
                self.connection.close()
                return
            self._take(json.loads(data), fds)

    def _take(self, message: dict[str, Any], fds: list[int]) -> None:
        if message["op"] == "forked":
            pid = int(message["pid"])
            self.children[pid] = self.answers[int(message["id"])] = WarmChild(self, pid, fds[0])
        elif message["op"] == "refused":
            self.answers[int(message["id"])] = str(message["reason"])
        elif message["op"] == "exited" and int(message["pid"]) in self.children:
            self.children.pop(int(message["pid"])).settle(int(message["code"]))


class WarmParent:
    """A client's hold on its host's warm parent: starts one where none serves at
    `address` (and again after one died), and asks it for forks."""

    def __init__(self, address: str, log_path: Path, environ: Mapping[str, str],
                 preload: tuple[str, ...] = ()) -> None:
        self.address = address
        self.log_path = log_path
        self.environ = dict(environ)
        self.preload = preload
        self.process: subprocess.Popen | None = None
        """The last warm parent this client started (another client's may serve it)."""
        self.link: _Link | None = None
        self.pid: int | None = None
        self.starts = 0
        self.forks = 0

    def request(self, args: list[str], env: dict[str, str], log_path: Path
                ) -> tuple[_Link, int]:
        """Ask for the worker `python args...` forked warm (starting a warm parent where
        none serves); `answer` says when it is."""
        link = self.connect()
        return link, link.request(args, env, str(log_path))

    def answer(self, asked: tuple[_Link, int], timeout_s: float = 0.0) -> WarmChild | str | None:
        """The child forked, why not (the caller starts a fresh interpreter), or None yet."""
        link, request = asked
        answer = link.answer(request, timeout_s)
        if isinstance(answer, WarmChild):
            self.forks += 1
        elif answer is not None:
            log.warning("no warm fork (%s); starting a fresh interpreter", answer)
        return answer

    def fork(self, args: list[str], env: dict[str, str], log_path: Path) -> WarmChild | None:
        """The worker forked warm, waiting for the answer; None where there is none."""
        answer = self.answer(self.request(args, env, log_path), START_TIMEOUT_S)
        return answer if isinstance(answer, WarmChild) else None

    def connect(self) -> _Link:
        """Connect to the warm parent serving at the address, starting one where none does
        (it imports meanwhile: forks asked for wait in its socket); returns the link."""
        if self.link is not None and not self.link.closed:
            return self.link
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect("\0" + self.address)
        except OSError:
            connection.close()
            self._start()
            connection = self._connect_started()
        self.link = _Link(connection)
        self.pid = socket_peer_pid(connection)
        return self.link

    def _start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", warm_parent.__name__, "--address", self.address]
        if self.preload:
            command += ["--preload", ",".join(self.preload)]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env={**fork_setup.warm_parent_env(self.environ), "PYTHONUNBUFFERED": "1"},
                start_new_session=True)
        self.starts += 1
        if self.starts > 1:
            log.warning("the warm parent at %s was gone; started another (pid %d)",
                        self.address, self.process.pid)

    def _connect_started(self) -> socket.socket:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                connection.connect("\0" + self.address)
                return connection
            except OSError:
                connection.close()
                if time.monotonic() > deadline or (
                        self.process is not None and self.process.poll() not in (None, 0)):
                    raise
                time.sleep(0.01)

    def describe(self) -> dict[str, Any] | None:
        """What status.json says of it: its pid, starts and forks (None: not started)."""
        if self.link is None:
            return None
        return {"pid": self.pid, "address": self.address, "starts": self.starts,
                "forks": self.forks, "alive": not self.link.closed}

    def close(self) -> None:
        """Leave it: it exits once its last client has gone."""
        if self.link is not None and not self.link.closed:
            self.link.connection.close()
            self.link.closed = True
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)

