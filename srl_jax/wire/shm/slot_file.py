"""A file of message slots in shared memory: one connecter's side of a same-host stream.

The file starts with a table (magic, then each area's slot count, slot size and layout
fingerprint, srl_jax/wire/shm/layout.py) that a binder checks against its own layouts
when it first maps a peer's file. Areas: the messages the connecter writes, and for a
request stream the replies written back into the same slot numbers.

Each slot starts with three stamps and a token, each with one writer at a time:
- `stamp`, the connecter's: a seqlock. It sets it to 0, writes, then sets it to the
  message's stamp (never 0, and what the doorbell record carries); a reader takes a slot
  only while its stamp is the one it was rung for, and checks it again once it has what
  it needs, so a slot rewritten underneath it is dropped, not misread.
- `claim` and `reader`, the binder's that took the message: the stamp it took and its
  token (srl_jax/wire/shm/place.py), written before it reads. A record whose stamp is
  already claimed or done is a duplicate (replayed) and dropped.
- `done`, the same binder's: the stamp it finished with (a chunk copied out, a request
  answered). Only then, or once the claimant's lock says it died, may the connecter
  write the slot again: a slot is never overwritten while its message waits or is read.

A connecter that withdraws an unclaimed message (a request it sends again elsewhere) and
a binder that claims it meet as in Dekker's algorithm: each writes (stamp 0; the claim),
then `fence`, then reads the other's field, so at least one of them sees the other and
backs off. Plain Python stores and loads are ordered on x86, the only CPU shared memory
is used on (place.py), but a store may still wait in a store buffer past a later load:
the fence, a lock's atomic instruction, drains it. Files are reserved whole when made
(`posix_fallocate`): a full /dev/shm is an error at the start, never a SIGBUS later.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
import threading
from pathlib import Path

from srl_jax.wire.codec import WireError
from srl_jax.wire.shm.layout import SlotLayout, SlotViews
from srl_jax.wire.shm.place import OPEN_FLAGS, check_private

MAGIC = b"SRLSLOT3"
MAX_AREAS = 2
TABLE = struct.Struct("<8sI4x" + "IxxxxQQ" * MAX_AREAS)
TABLE_BYTES = 128
_FENCE = threading.Lock()


def fence() -> None:
    """A full memory barrier: the stores before it are seen before the loads after it."""
    _FENCE.acquire()
    _FENCE.release()


def file_bytes(areas: list[tuple[int, SlotLayout]]) -> int:
    """The size of a slot file of `areas` (count, layout)."""
    return TABLE_BYTES + sum(count * layout.slot_bytes for count, layout in areas)


class SlotFile:
    """A mapped file of areas of slots, each area of one layout."""

    def __init__(self, path: Path, fd: int, areas: list[tuple[int, SlotLayout]]) -> None:
        self.path = path
        self.counts = [count for count, _ in areas]
        self.nbytes = file_bytes(areas)
        try:
            self._mm = mmap.mmap(fd, self.nbytes)
        finally:
            os.close(fd)
        self.words = memoryview(self._mm).cast("Q")
        self._u32 = memoryview(self._mm).cast("I")
        self.views, start = [], TABLE_BYTES
        for count, layout in areas:
            self.views.append(SlotViews(layout, self._mm, start, count))
            start += count * layout.slot_bytes
        self.stamp_at = [[views.base(slot) >> 3 for slot in range(count)]
                          for views, (count, _) in zip(self.views, areas, strict=True)]
        """Each slot's stamp as an index of `words` (its claim and done follow it)."""

    @classmethod
    def create(cls, path: Path, areas: list[tuple[int, SlotLayout]]) -> SlotFile:
        """Make the file (0600; it must not exist yet), reserved whole: OSError if
        /dev/shm cannot hold it."""
        if not 1 <= len(areas) <= MAX_AREAS or any(count < 1 for count, _ in areas):
            raise ValueError(f"bad slot areas {areas}")
        nbytes = file_bytes(areas)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
            table = [*((count, layout.slot_bytes, layout.fingerprint) for count, layout in areas),
                     *[(0, 0, 0)] * (MAX_AREAS - len(areas))]
            os.pwrite(fd, TABLE.pack(MAGIC, len(areas), *(v for row in table for v in row)), 0)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, fd, areas)

    @classmethod
    def open(cls, path: Path, layouts: list[SlotLayout], max_slots: int) -> SlotFile:
        """Map a peer's file if its table names `layouts` (at most `max_slots` slots
        each) and its size fits; OSError: it is gone, or not a private file of this user's
        (place.NotPrivate); WireError: it is not such a file."""
        fd = os.open(path, os.O_RDWR | OPEN_FLAGS)
        try:
            st = os.fstat(fd)
            check_private(path, stat.S_IFREG, st)
            size = st.st_size
            raw = os.pread(fd, TABLE.size, 0)
            if len(raw) != TABLE.size:
                raise WireError("slot file without its table")
            magic, count, *values = TABLE.unpack(raw)
            rows = [values[3 * i:3 * i + 3] for i in range(MAX_AREAS)]
            if magic != MAGIC or count != len(layouts) or any(
                    not 1 <= n <= max_slots or size_ != layout.slot_bytes
                    or fingerprint != layout.fingerprint
                    for (n, size_, fingerprint), layout in zip(rows, layouts, strict=False)):
                raise WireError("slot file of another layout")
            areas = [(row[0], layout) for row, layout in zip(rows, layouts, strict=False)]
            if file_bytes(areas) != size:
                raise WireError("slot file of the wrong size")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, areas)

    def stamp(self, area: int, slot: int) -> int:
        return self.words[self.stamp_at[area][slot]]

    def set_stamp(self, area: int, slot: int, stamp: int) -> None:
        """0 before writing (or to withdraw a message), the message's stamp after."""
        self.words[self.stamp_at[area][slot]] = stamp

    def claim(self, area: int, slot: int) -> tuple[int, int]:
        """(the stamp a binder took, its token)."""
        at = self.stamp_at[area][slot]
        return self.words[at + 1], self._u32[2 * at + 6]

    def set_claim(self, area: int, slot: int, stamp: int, reader: int) -> None:
        """The token first: whoever sees the claim sees whose it is."""
        at = self.stamp_at[area][slot]
        self._u32[2 * at + 6] = reader
        self.words[at + 1] = stamp

    def done(self, area: int, slot: int) -> int:
        """The stamp the binder that claimed it finished with."""
        return self.words[self.stamp_at[area][slot] + 2]

    def set_done(self, area: int, slot: int, stamp: int) -> None:
        self.words[self.stamp_at[area][slot] + 2] = stamp

    def close(self, unlink: bool = False) -> None:
        """Unmap (once no array views it any more) and, with `unlink`, remove the file."""
        if unlink:
            self.path.unlink(missing_ok=True)
        with contextlib.suppress(BufferError):  # arrays still view it: the GC unmaps it
            for views in self.views:
                views.release()
            self.words.release()
            self._u32.release()
            self._mm.close()
