"""A file of message slots in shared memory: one connecter's side of a same-host stream.

The file starts with a table (magic, then each area's slot count, slot size and layout
fingerprint, srl_jax/core/shm/layout.py) that a binder checks against its own layouts
when it first maps a peer's file. Areas: the messages the connecter writes, and for a
request stream the replies written back into the same slot numbers.

Each slot starts with a stamp, a seqlock: a writer sets it to 0, writes, then sets it
to the message's stamp (never 0, and what the doorbell record carries); a reader takes
a slot only while its stamp is the one it was rung for, and checks it again once it has
copied what it needs, so a slot rewritten underneath it is dropped, not misread. Then
its `state`, used by the chunk rings: FULL until a binder has copied the chunk, FREE
again after, TAKEN (with the reader's pid) while it copies, so that a writer can take
back a slot whose reader died. Files are reserved whole when made (`posix_fallocate`):
a full /dev/shm is an error at the start, never a SIGBUS later.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path

from srl_jax.core.shm.layout import SlotLayout, SlotViews
from srl_jax.core.wire import WireError

MAGIC = b"SRLSLOT2"
MAX_AREAS = 2
TABLE = struct.Struct("<8sI4x" + "IxxxxQQ" * MAX_AREAS)
TABLE_BYTES = 128
FREE, FULL, TAKEN = 0, 1, 2


class SlotFile:
    """A mapped file of areas of slots, each area of one layout."""

    def __init__(self, path: Path, fd: int, areas: list[tuple[int, SlotLayout]]) -> None:
        self.path = path
        self.counts = [count for count, _ in areas]
        self.nbytes = TABLE_BYTES + sum(count * layout.slot_bytes for count, layout in areas)
        try:
            self._mm = mmap.mmap(fd, self.nbytes)
        finally:
            os.close(fd)
        self._u64 = memoryview(self._mm).cast("Q")
        self._u32 = memoryview(self._mm).cast("I")
        self.views, start = [], TABLE_BYTES
        for count, layout in areas:
            self.views.append(SlotViews(layout, self._mm, start, count))
            start += count * layout.slot_bytes
        self._stamp_at = [[views.base(slot) >> 3 for slot in range(count)]
                          for views, (count, _) in zip(self.views, areas, strict=True)]

    @classmethod
    def create(cls, path: Path, areas: list[tuple[int, SlotLayout]]) -> SlotFile:
        """Make the file (0600; it must not exist yet), reserved whole: OSError if
        /dev/shm cannot hold it."""
        if not 1 <= len(areas) <= MAX_AREAS or any(count < 1 for count, _ in areas):
            raise ValueError(f"bad slot areas {areas}")
        nbytes = TABLE_BYTES + sum(count * layout.slot_bytes for count, layout in areas)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
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
        each) and its size fits; OSError: it is gone; WireError: it is not such a file."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
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
            if TABLE_BYTES + sum(n * layout.slot_bytes for n, layout in areas) != size:
                raise WireError("slot file of the wrong size")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, areas)

    def stamp(self, area: int, slot: int) -> int:
        return self._u64[self._stamp_at[area][slot]]

    def set_stamp(self, area: int, slot: int, stamp: int) -> None:
        """0 before writing (or to withdraw a message), the message's stamp after."""
        self._u64[self._stamp_at[area][slot]] = stamp

    def state(self, area: int, slot: int) -> tuple[int, int]:
        """(state, the reader's pid while TAKEN)."""
        at = (self.views[area].base(slot) >> 2) + 2
        return self._u32[at], self._u32[at + 1]

    def set_state(self, area: int, slot: int, state: int, reader: int = 0) -> None:
        at = (self.views[area].base(slot) >> 2) + 2
        self._u32[at + 1] = reader
        self._u32[at] = state

    def close(self, unlink: bool = False) -> None:
        """Unmap (once no array views it any more) and, with `unlink`, remove the file."""
        if unlink:
            self.path.unlink(missing_ok=True)
        with contextlib.suppress(BufferError):  # arrays still view it: the GC unmaps it
            for views in self.views:
                views.release()
            self._u64.release()
            self._u32.release()
            self._mm.close()
