"""Name service: how workers find each other's endpoints.

A worker that binds a socket registers its endpoint under its stream's key
(`srl_jax.dataflow.stream_table`); a worker that connects looks the key up, waiting
until it appears. The local backend keeps names as files in the run
directory; a cluster backend implements the same two-method interface.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_POLICY = "default"
"""The policy of a run that names none: its workers and keys carry no policy name."""

POLL_S = 0.02
"""Longest a file lookup waits between checks of its key: where no change is reported
(another host's write to a shared directory; a system without inotify)."""
IN_CLOSE_WRITE, IN_MOVED_TO = 0x8, 0x80
"""inotify's events for a file written in place and one renamed into the directory."""


def policy_key(policy: str, key: str) -> str:
    """`key` in `policy`'s namespace: each policy has its own learner and servers.

    The default policy (the only one of a single-agent run) keeps the plain key.
    """
    return key if policy == DEFAULT_POLICY else f"{policy}/{key}"


def worker_name(kind: str, index: int, policy: str = DEFAULT_POLICY) -> str:
    """A worker's name in logs, status.json and metrics: `learner-0`, `learner-red-0`."""
    return f"{kind}-{index}" if policy == DEFAULT_POLICY else f"{kind}-{policy}-{index}"


class NameService(Protocol):
    def register(self, key: str, endpoint: str) -> None:
        """Publish `endpoint` under `key`, replacing an older entry."""

    def lookup(self, key: str, timeout_s: float) -> str:
        """The endpoint under `key`, waiting up to `timeout_s` for it to appear."""

    def get(self, key: str) -> str | None:
        """The endpoint under `key` now, or None."""

    def unregister(self, key: str) -> None:
        """Forget `key` (its owner is gone and will register anew)."""

    def moved(self, followed: Mapping[str, str]) -> dict[str, str]:
        """Of `followed` (key: the endpoint in use), the keys now under another endpoint,
        with it. Never raises and never waits: a name service that does not answer
        moves nothing, and its user keeps the endpoints it has."""


def moved_by_get(names: NameService, followed: Mapping[str, str]) -> dict[str, str]:
    """`NameService.moved` for a service whose `get` is local and cheap."""
    now = {key: names.get(key) for key in followed}
    return {key: endpoint for key, endpoint in now.items()
            if endpoint and endpoint != followed[key]}


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, for inotify: Linux's alone."""
    return ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class DirectoryWatch:
    """Wakes a wait when a file is written or renamed into a directory (Linux's inotify):
    a lookup sees its key as it is registered, not at its next check. Where the kernel
    gives no watch (another system, no inotify instance left), a wait is a plain sleep."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._fd: int | None = None
        """The inotify instance; None until the first wait, -1 where there is none."""

    def wait(self, timeout_s: float) -> None:
        """Until a file changes in the directory or `timeout_s` has passed. The first wait
        opens the watch and returns at once, for the caller to check again: a change made
        before the watch is seen by that check, and a key already there costs no watch."""
        if self._fd is None:
            self._fd = self._open()
            return
        if self._fd < 0:
            time.sleep(timeout_s)
            return
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        if poller.poll(timeout_s * 1000):
            with contextlib.suppress(BlockingIOError):
                os.read(self._fd, 1 << 16)

    def _open(self) -> int:
        libc = _libc()
        if libc is None:
            return -1
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(self._root),
                                              IN_CLOSE_WRITE | IN_MOVED_TO) < 0:
            os.close(fd)
            return -1
        return fd

    def close(self) -> None:
        """Closing a watched inotify instance waits out a kernel grace period (8 to 20 ms):
        a helper thread does it, and the lookup returns at once."""
        if self._fd is not None and self._fd >= 0:
            threading.Thread(target=os.close, args=(self._fd,), name="inotify close",
                             daemon=True).start()
        self._fd = -1

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class FileNameService:
    """Names as small files under `<run_dir>/names/`, written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / key.replace("/", "__")

    def register(self, key: str, endpoint: str) -> None:
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(endpoint)
        tmp.replace(path)

    def unregister(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def get(self, key: str) -> str | None:
        try:
            return self._path(key).read_text().strip() or None
        except FileNotFoundError:
            return None

    def moved(self, followed: Mapping[str, str]) -> dict[str, str]:
        try:
            return moved_by_get(self, followed)
        except OSError as error:  # a shared disk that hiccups moves nothing this time
            log.warning("names unreadable in %s: %s", self.root, error)
            return {}

    def lookup(self, key: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        next_log = time.monotonic() + 5.0
        with DirectoryWatch(self.root) as watch:
            while True:
                endpoint = self.get(key)
                if endpoint:
                    return endpoint
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"no endpoint registered under '{key}' after "
                                       f"{timeout_s:.0f}s")
                if now >= next_log:
                    log.info("waiting for '%s' to register in %s", key, self.root)
                    next_log = now + 5.0
                watch.wait(min(POLL_S, deadline - now))
