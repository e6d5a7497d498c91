"""Where a run's shared memory lives, and how it never outlives the run.

Every same-host stream's files (srl_jax/core/shm/) sit in one directory in /dev/shm per
*owner*: the process that started the workers of this host and cleans up after them
(the controller, with the local backend), named by the owner's pid and its start time,
so that a recycled pid is never taken for the owner. The owner gives its workers its pid
(`OWNER_ENV`; a worker without it uses ZeroMQ), removes the directory when it exits,
and first removes the directories of owners that are gone (a controller killed with
SIGKILL leaves its directory to the next start on this host). A worker that starts
sweeps the files of dead peers in its directory (an actor killed with SIGKILL leaves its
slots to its successor). Only this user's directories are touched, and they are 0700.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

SHM_ROOT = Path("/dev/shm")
OWNER_ENV = "SRL_JAX_SHM_OWNER"
"""The pid of the owner of a worker's shared memory, in the worker's environment."""
DIR_PREFIX = "srl_jax-"
PEER_FILE = re.compile(r"^.+\.(\d+)\.(slots|reply)$")
"""A connecter's files: `<stream bell>.<pid>.slots` and `.reply`."""


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None: no such process or no
    /proc (shared memory is then off)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: split after it
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def available(root: Path = SHM_ROOT) -> bool:
    """Whether this host has a tmpfs for shared memory and /proc to name owners by."""
    return root.is_dir() and os.access(root, os.W_OK) and start_ticks(os.getpid()) is not None


def owner_dir(owner_pid: int, root: Path = SHM_ROOT) -> Path | None:
    """The directory of the workers started by process `owner_pid` (None: no such
    process, or no shared memory on this host)."""
    ticks = start_ticks(owner_pid)
    if ticks is None or not root.is_dir():
        return None
    return root / f"{DIR_PREFIX}{os.getuid()}-{owner_pid}-{ticks}"


def make_owner_dir(owner_pid: int, root: Path = SHM_ROOT) -> Path | None:
    """`owner_dir`, created (0700) if it is not there yet."""
    directory = owner_dir(owner_pid, root)
    if directory is not None:
        directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def sweep_stale(root: Path = SHM_ROOT) -> list[Path]:
    """Remove this user's directories whose owner has exited; returns them."""
    removed = []
    pattern = re.compile(rf"^{re.escape(DIR_PREFIX)}{os.getuid()}-(\d+)-(\d+)$")
    with contextlib.suppress(OSError):
        for path in root.iterdir():
            match = pattern.match(path.name)
            if match and start_ticks(int(match[1])) != int(match[2]):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def remove_own(root: Path = SHM_ROOT) -> None:
    """Remove the directory of this process's workers (at the owner's exit)."""
    directory = owner_dir(os.getpid(), root)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts as gone: it keeps no mapping)."""
    ticks_path = Path(f"/proc/{pid}/stat")
    try:
        return ") Z " not in ticks_path.read_text()
    except OSError:
        return False


def sweep_dead_peers(directory: Path) -> list[Path]:
    """Remove the connecters' files in `directory` whose process has exited."""
    removed = []
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            match = PEER_FILE.match(path.name)
            if match and not alive(int(match[1])):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
