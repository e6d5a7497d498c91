"""Doorbells: FIFOs that carry only which slot holds a message (srl_jax/core/shm/).

A record is 16 bytes (the writer's pid, the slot, a magic number, the slot's stamp);
writes of up to PIPE_BUF bytes to a FIFO are atomic, so any number of connecters ring
one binder's bell, and
the binders of one stream on a host (its inference servers, its replay servers) read
the same bell: each record goes to whichever reads it first, which spreads requests
over them as a ZMQ DEALER would. The reading end is opened read-write, so it never sees
end-of-file while writers come and go, and the bell survives a binder's restart: its
successor reads what was rung meanwhile. A bell can be polled (`fileno`) beside ZMQ
sockets in one `zmq.Poller`. A read that holds anything but whole records with the
magic (a writer that is not ours, or a cut write) is dropped with all the FIFO holds, so
the next records start aligned again; the requests dropped with it are sent again after
their timeout, like those a dead server took.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections import deque
from pathlib import Path

RECORD = struct.Struct("<IHHQ")
MAGIC = 0x5B11
READ_RECORDS = 256
"""Records taken from the FIFO per read."""


class Bell:
    """The reading end of a doorbell (made if it is not there yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path, 0o600)
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._pending: deque[tuple[int, int, int]] = deque()
        self.torn = 0
        """Reads dropped for a record that was cut or not ours."""

    def fileno(self) -> int:
        return self.fd

    @property
    def pending(self) -> bool:
        """Records already read from the FIFO and not taken yet (poll would not show them)."""
        return bool(self._pending)

    def next(self) -> tuple[int, int, int] | None:
        """The next record (pid, slot, stamp), or None if none is waiting."""
        if not self._pending:
            try:
                data = os.read(self.fd, RECORD.size * READ_RECORDS)
            except BlockingIOError:
                return None
            records = RECORD.iter_unpack(data) if len(data) % RECORD.size == 0 else None
            records = [(pid, slot, stamp) for pid, slot, magic, stamp in records
                       if magic == MAGIC] if records is not None else []
            if len(records) * RECORD.size != len(data):
                self._drop_all()
                return None
            self._pending.extend(records)
        return self._pending.popleft() if self._pending else None

    def _drop_all(self) -> None:
        """Empty the FIFO: what follows a cut record would be read out of step."""
        self.torn += 1
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, RECORD.size * READ_RECORDS):
                pass

    def close(self) -> None:
        os.close(self.fd)


class Ringer:
    """A writing end of a binder's doorbell, opened when first rung (the bell may not
    have a reader yet) and kept: a binder that restarts reads the same FIFO."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def ring(self, pid: int, slot: int, stamp: int) -> bool:
        """Ring for `slot`; False when no reader holds the bell or it is full (the record
        is not queued: the message in the slot is as good as not sent)."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as error:
                if error.errno in (errno.ENXIO, errno.ENOENT):
                    return False
                raise
        try:
            os.write(self.fd, RECORD.pack(pid, slot, MAGIC, stamp))
            return True
        except (BlockingIOError, BrokenPipeError):
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
