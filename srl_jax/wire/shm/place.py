"""Where a run's shared memory lives, who owns it, and how the kernel says who is alive.

Every same-host stream's files (srl_jax/wire/shm/) sit in one directory in /dev/shm per
*owner*: the process that starts the workers of this host and cleans up after them (the
controller, with the local backend). The owner makes it under a random name with
`mkdir` (which fails on anything already there), 0700, checks that it is its own, and
holds an `flock` on the lock file inside for its whole life; it gives its workers the
path (`OWNER_ENV`; a worker without it uses ZeroMQ) and removes the directory when it
exits. A sweep (at each owner's start) removes only directories whose lock it can take:
the kernel drops a lock with the last descriptor of its holder, so a directory whose lock
is free has no owner, whatever PID namespace that owner lived in (two containers sharing
/dev/shm see each other's pids as strangers, and their own pids may be the same numbers).

Peers (each end of a same-host stream a worker opens) are named alike: a random token
whose presence file (`peer.<token>`) the end creates exclusively and holds locked for
its life. Its slot files carry the token, its doorbell records carry the token, and a
binder that claims a slot writes its own token there: whether a peer lives is whether
its lock is held, which pid reuse cannot fake. Locks are closed in a child after `fork`,
so a forked child never holds its parent's lock as its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import re
import secrets
import shutil
import stat
import time
import weakref
from pathlib import Path

SHM_ROOT = Path("/dev/shm")
OWNER_ENV = "SRL_JAX_SHM_DIR"
"""The path of the owner's directory, in its workers' environment."""
DIR_PREFIX = "srl_jax-"
OWNER_LOCK = "owner.lock"
PRESENCE = re.compile(r"^peer\.([0-9a-f]{8})$")
PEER_FILE = re.compile(r"^.+\.([0-9a-f]{8})\.(slots|reply)$")
"""A connecter's files: `<stream stem>.<token>.slots` and `.reply`."""
ORPHAN_AGE_S = 60.0
"""A directory of ours without a lock file (one being made, or left by an older
version) is removed by a sweep only once it is this old."""
ORDERED_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
"""Where stores are seen in program order and loads are not reordered with each other
(x86's TSO), which is all the slots' seqlocks need from plain Python writes."""
OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


class NotPrivate(OSError):
    """A path of the shared memory that is not this user's alone (mode, owner, kind)."""


def unsupported_reason(root: Path = SHM_ROOT) -> str | None:
    """Why this host cannot use shared memory, or None where it can."""
    if platform.machine().lower() not in ORDERED_MACHINES:
        return (f"shared memory needs an x86 CPU (its slots are seqlocks that rely on x86's "
                f"store order); this is {platform.machine()}")
    if not (root.is_dir() and os.access(root, os.W_OK)):
        return f"no writable {root}"
    return None


KIND_NAMES = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFREG: "a file"}


def check_private(path: Path, kind: int, st: os.stat_result | None = None) -> None:
    """NotPrivate unless `path` (or its `fstat`) is of `kind` (stat.S_IFDIR ...), this
    user's, not a link and closed to group and others."""
    st = st or os.lstat(path)
    if stat.S_IFMT(st.st_mode) != kind:
        raise NotPrivate(f"{path}: not {KIND_NAMES[kind]}")
    if st.st_uid != os.geteuid():
        raise NotPrivate(f"{path}: owned by uid {st.st_uid}, not {os.geteuid()}")
    if st.st_mode & 0o077:
        raise NotPrivate(f"{path}: mode {stat.S_IMODE(st.st_mode):o}")


def free_bytes(root: Path = SHM_ROOT) -> int:
    """Bytes this user may still allocate in `root`."""
    vfs = os.statvfs(root)
    return vfs.f_bavail * vfs.f_frsize


_HELD: weakref.WeakSet[HeldLock] = weakref.WeakSet()


def _close_in_child() -> None:
    """After fork: the child shares its parent's lock descriptions; it lets them go, so the
    lock goes with the parent (the parent's own descriptors stay open)."""
    for lock in list(_HELD):
        lock.forget()


os.register_at_fork(after_in_child=_close_in_child)


class HeldLock:
    """An exclusive `flock` on a file this process made, held until `release` or exit."""

    def __init__(self, path: Path) -> None:
        """Make `path` (it must not exist) and lock it; FileExistsError if it exists. The
        file is locked under a name of its own first and linked to `path` after, so that
        no one ever sees `path` unlocked and takes its maker for dead."""
        self.path = path
        staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        self.fd: int | None = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS,
                                      0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            os.link(staging, path)
        except BaseException:
            self.forget()
            raise
        finally:
            staging.unlink()
        _HELD.add(self)

    def forget(self) -> None:
        """Close without unlinking (a forked child's copy)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release(self, unlink: bool = True) -> None:
        if self.fd is not None and unlink:
            self.path.unlink(missing_ok=True)
        self.forget()


def held(path: Path) -> bool:
    """Whether some live process holds the lock of `path` (False: it is gone, or nobody
    does). The probe's own shared lock goes with its descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class OwnerDirectory:
    """An owner's directory, made new and private, locked while the owner lives."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.path = root / f"{DIR_PREFIX}{os.geteuid()}-{secrets.token_hex(8)}"
        os.mkdir(self.path, 0o700)  # FileExistsError on anything there, never reused
        try:
            check_private(self.path, stat.S_IFDIR)
            self.lock = HeldLock(self.path / OWNER_LOCK)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        self.pid = os.getpid()

    def remove(self) -> None:
        """Remove the directory (at the owner's exit, its workers gone); not in a forked
        child, which owns nothing."""
        if os.getpid() == self.pid:
            shutil.rmtree(self.path, ignore_errors=True)
            self.lock.release(unlink=False)


def sweep_stale(root: Path = SHM_ROOT) -> list[Path]:
    """Remove this user's directories that no live owner holds; returns them."""
    removed = []
    prefix = f"{DIR_PREFIX}{os.geteuid()}-"
    with contextlib.suppress(OSError):
        for path in root.iterdir():
            if path.name.startswith(prefix) and _ownerless(path):
                removed.append(path)
    return removed


def _ownerless(path: Path) -> bool:
    """Remove `path` if no live owner holds it (while holding its lock, so that no owner
    takes it meanwhile); whether it was removed."""
    try:
        check_private(path, stat.S_IFDIR)
        fd = os.open(path / OWNER_LOCK, os.O_RDONLY | OPEN_FLAGS)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(path).st_mtime > ORPHAN_AGE_S:
                shutil.rmtree(path, ignore_errors=True)
                return True
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(path, ignore_errors=True)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class Presence:
    """One end of a stream's presence in a directory (an `Outbox`, an `Inbox`): a random
    token whose file it made exclusively and holds locked until `leave`."""

    def __init__(self, directory: Path) -> None:
        while True:
            self.token = secrets.randbits(32) or 1
            with contextlib.suppress(FileExistsError):
                self.lock = HeldLock(presence_path(directory, self.token))
                break

    def leave(self) -> None:
        """Remove the presence file (after the end's own files)."""
        self.lock.release()


def presence_path(directory: Path, token: int) -> Path:
    return directory / f"peer.{token:08x}"


def alive(directory: Path, token: int) -> bool:
    """Whether the peer of `token` in `directory` lives (its presence lock is held)."""
    return held(presence_path(directory, token))


def sweep_dead_peers(directory: Path) -> list[Path]:
    """Remove the presence files of peers that are gone, and their files; returns the
    files removed (presence files apart)."""
    removed = []
    with contextlib.suppress(OSError):
        entries = list(directory.iterdir())
        live = set()
        for path in entries:
            match = PRESENCE.match(path.name)
            if match and held(path):
                live.add(match[1])
            elif match:
                path.unlink(missing_ok=True)
        for path in entries:
            match = PEER_FILE.match(path.name)
            if match and match[1] not in live and not alive(directory, int(match[1], 16)):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
