"""Doorbells: FIFOs that carry only which slot holds a message (srl_jax/wire/shm/).

A record is 16 bytes (the writer's token, srl_jax/wire/shm/place.py; the slot; a magic
number; the slot's stamp); writes of up to PIPE_BUF bytes to a FIFO are atomic, so any
number of connecters ring one binder's bell, and the binders of one stream on a host (a
policy's inference servers) read the same bell: each record goes to whichever reads it
first. A reader takes no more records than it is about to serve (`next`'s `limit`), so
that the rest stay in the FIFO for an idle peer and a dead server strands only what it
was serving. The reading end is opened read-write, so it never sees end-of-file while
writers come and go, and the bell survives a binder's restart: its successor reads what
was rung meanwhile. A bell can be polled (`fileno`) beside ZMQ sockets in one
`zmq.Poller`. A read that holds anything but whole records with the magic (a writer that
is not ours, or a cut write) is dropped with all the FIFO holds, so the next records start
aligned again; what was dropped with it is sent again after its timeout.

A ringer follows its bell: when a ring fails (no reader: EPIPE, ENXIO; no FIFO: ENOENT),
or once a second, it checks the path and opens it again if it names another FIFO (a
binder made a new one), and says so (`moved`), so that the connecter rings again for
what it had rung on the old one. Bells and ringers open only a FIFO of this user's, mode
0600, never through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import time
from collections import deque
from pathlib import Path

from srl_jax.wire.shm.place import OPEN_FLAGS, check_private

RECORD = struct.Struct("<IHHQ")
MAGIC = 0x5B11
MAX_SLOTS = 1 << 16
"""Slots a record can name (its 16 bits): the most slots of one area of a slot file."""
READ_RECORDS = 256
"""Records taken from the FIFO per read where one binder alone reads the bell."""
RECHECK_S = 1.0
"""How often a ringer checks that its path still names the FIFO it holds."""
GONE = (errno.EPIPE, errno.ENXIO, errno.ENOENT)


class Bell:
    """The reading end of a doorbell (made if it is not there yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path, 0o600)
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | OPEN_FLAGS)
        try:
            check_private(path, stat.S_IFIFO, os.fstat(self.fd))
        except OSError:
            os.close(self.fd)
            raise
        self._pending: deque[tuple[int, int, int]] = deque()
        self.torn = 0
        """Reads dropped for a record that was cut or not ours."""

    def fileno(self) -> int:
        return self.fd

    @property
    def pending(self) -> bool:
        """Records already read from the FIFO and not taken yet (poll would not show them)."""
        return bool(self._pending)

    def next(self, limit: int = READ_RECORDS) -> tuple[int, int, int] | None:
        """The next record (token, slot, stamp), or None if none is waiting; reads at most
        `limit` records from the FIFO at once."""
        if not self._pending:
            try:
                data = os.read(self.fd, RECORD.size * max(1, limit))
            except BlockingIOError:
                return None
            records = [(token, slot, stamp) for token, slot, magic, stamp
                       in RECORD.iter_unpack(data)
                       if magic == MAGIC] if len(data) % RECORD.size == 0 else []
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
    """A writing end of a binder's doorbell, opened when first rung (the bell may not have
    a reader yet), kept while it works and opened again where the path moved on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self._inode: int | None = None
        self._checked = 0.0
        self.moved = False
        """The path named another FIFO than the one rung before (cleared by the caller)."""

    def ring(self, token: int, slot: int, stamp: int) -> bool:
        """Ring for `slot`; False when no reader holds the bell or it is full (the record
        is not queued: the message in the slot is as good as not sent)."""
        record = RECORD.pack(token, slot, MAGIC, stamp)
        now = time.monotonic()
        if now - self._checked > RECHECK_S:
            self._checked = now
            self._follow()
        sent = self._write(record)
        if sent is None and self._open():  # the FIFO the path names now
            sent = self._write(record)
        return bool(sent)

    def _write(self, record: bytes) -> bool | None:
        """True: queued; False: the bell is full; None: it has no reader (let go)."""
        if self.fd is None:
            return None
        try:
            os.write(self.fd, record)
            return True
        except BlockingIOError:
            return False
        except OSError as error:
            if error.errno not in GONE:
                raise
            self.close()
            return None

    def _follow(self) -> None:
        """Let the FIFO go if the path now names another one (or none)."""
        if self.fd is None:
            return
        try:
            inode = os.stat(self.path, follow_symlinks=False).st_ino
        except OSError:
            inode = None
        if inode != self._inode:
            self.close()

    def _open(self) -> bool:
        """Open the FIFO the path names; False where there is none with a reader, or what
        is there is not a private FIFO of ours (it is not rung: the connecter's sends fail,
        and it hands the stream to ZeroMQ in the end)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | OPEN_FLAGS)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            check_private(self.path, stat.S_IFIFO, st)
        except OSError:
            os.close(fd)
            return False
        if self._inode is not None and st.st_ino != self._inode:
            self.moved = True
        self.fd, self._inode = fd, st.st_ino
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
