"""The shared-memory floor's transport, both ends: a segment of request and reply slots
(one of each per asker) and FIFO doorbells that carry only a slot's index.

An asker writes its request rows into its slot and one byte, the slot's index, into the
server's FIFO; the server reads every waiting index at once, gathers those slots' rows
into one batch, writes each reply into its slot and one byte into that asker's FIFO.
Writes of one byte to a FIFO are atomic, so any number of askers share the server's.
The segment is a file in /dev/shm (tmpfs; the temporary directory where there is
none), mapped by both ends with numpy: no `multiprocessing.shared_memory`, whose
resource tracker would unlink it when the measuring process exits. The server creates
and removes it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
REPLY_FIELDS = 3
"""A reply row: action, log-probability, value (float32 each here)."""


@dataclass
class SlotSegment:
    """The mapped segment: `requests` [askers, rows, *obs], `replies` [askers, 3, rows]."""

    path: Path
    requests: np.ndarray
    replies: np.ndarray

    @classmethod
    def map(cls, path: Path, case: dict[str, Any], create: bool) -> SlotSegment:
        askers, rows = case["in_flight"], case["envs"]
        request_shape = (askers, rows, *case["obs_shape"])
        request_bytes = int(np.prod(request_shape)) * np.dtype(case["obs_dtype"]).itemsize
        mapped = np.memmap(path, np.uint8, "w+" if create else "r+",
                           shape=(request_bytes + askers * REPLY_FIELDS * rows * 4,))
        requests = mapped[:request_bytes].view(case["obs_dtype"]).reshape(request_shape)
        replies = mapped[request_bytes:].view(np.float32).reshape(askers, REPLY_FIELDS, rows)
        return cls(path, requests, replies)


def segment_path(case: dict[str, Any]) -> Path:
    return SHM_DIR / f"srl_jax-overhead-{os.getpid()}-{case['name']}"


def doorbell_path(root: Path) -> Path:
    """The server's FIFO: slot indices of waiting requests."""
    return root / "requests.fifo"


def reply_path(root: Path, asker: int) -> Path:
    """Asker `asker`'s FIFO: one byte per reply in its slot."""
    return root / f"reply-{asker}.fifo"


def make_fifos(root: Path, askers: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for path in (doorbell_path(root), *(reply_path(root, i) for i in range(askers))):
        os.mkfifo(path)


def open_held(path: Path) -> int:
    """A FIFO opened to read and write without blocking: the opener holds a writer of its
    own, so the other end's open never waits and its close never reads as a hang-up."""
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)
