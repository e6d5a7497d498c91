"""Slot layouts: where each part of a message sits in a slot, fixed for a run.

A layout names the message's integer metadata (`ints`: split, seq, version ...) and its
fields: arrays of up to `max_rows` rows of a fixed row shape and dtype (observations,
actions, a chunk's arrays), and metadata lists kept as arrays (a chunk's recent episode
returns, an opponent pool's versions). Both ends build the same layout from the run's
config and the policy's spec (srl_jax/core/shm/stream_layouts.py); the slot file carries
its fingerprint, and a binder maps no file whose layouts are not its own. A message then
needs no header to parse: the only thing read from shared memory that could be wrong is
each field's row count, and one above its `max_rows` is a malformed slot (counted and
dropped). Dtypes and shapes cannot differ; nothing is unpickled.

    slot: stamp u64 | state u32 | reader u32 | rows u32 per field (to 8 bytes) |
          ints i64 each | each field's max_rows x row bytes (each from 8 bytes)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from srl_jax.core.wire import WireError

ABSENT = 0xFFFFFFFF
"""A field's row count when the message leaves it out (a policy without a state)."""
PREFIX_BYTES = 16
"""stamp u64, state u32, reader u32."""


def _aligned(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True)
class Field:
    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    max_rows: int
    as_list: bool = False
    """Metadata that travels as a list (`meta[name]`), not an array."""

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class SlotLayout:
    kind: str
    """The wire message kind it carries (srl_jax/core/wire.py)."""
    ints: tuple[str, ...]
    fields: tuple[Field, ...]

    @cached_property
    def ints_offset(self) -> int:
        return PREFIX_BYTES + _aligned(4 * len(self.fields))

    @cached_property
    def field_offsets(self) -> tuple[int, ...]:
        offset, offsets = self.ints_offset + 8 * len(self.ints), []
        for field in self.fields:
            offsets.append(offset)
            offset += _aligned(field.max_rows * field.row_bytes)
        return tuple(offsets)

    @cached_property
    def slot_bytes(self) -> int:
        last = self.fields[-1] if self.fields else None
        end = self.field_offsets[-1] + last.max_rows * last.row_bytes if last else \
            self.ints_offset + 8 * len(self.ints)
        return max(_aligned(end), 64)

    @cached_property
    def fingerprint(self) -> int:
        """A hash of the layout (u64): both ends of a stream must agree on it."""
        text = repr((self.kind, self.ints, [(f.name, f.dtype.str, f.row_shape, f.max_rows,
                                             f.as_list) for f in self.fields]))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


class SlotViews:
    """One area's slots of one layout, as numpy views into the mapping at `start`."""

    def __init__(self, layout: SlotLayout, buffer: Any, start: int, slots: int) -> None:
        self.layout = layout
        self._u32 = memoryview(buffer).cast("I")
        self._i64 = memoryview(buffer).cast("q")
        self._bases = [start + slot * layout.slot_bytes for slot in range(slots)]
        self._views = [[np.ndarray((f.max_rows, *f.row_shape), f.dtype, buffer, base + offset)
                        for f, offset in zip(layout.fields, layout.field_offsets, strict=True)]
                       for base in self._bases]

    def base(self, slot: int) -> int:
        return self._bases[slot]

    def write(self, slot: int, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
              ) -> None:
        """The message's parts into `slot` (ValueError: it does not fit the layout)."""
        layout, base = self.layout, self._bases[slot]
        rows_at, ints_at = (base + PREFIX_BYTES) >> 2, (base + layout.ints_offset) >> 3
        for i, name in enumerate(layout.ints):
            self._i64[ints_at + i] = meta[name]
        for j, (field, view) in enumerate(zip(layout.fields, self._views[slot], strict=True)):
            value = meta.get(field.name) if field.as_list else arrays.get(field.name)
            if value is None:
                self._u32[rows_at + j] = ABSENT
                continue
            rows = len(value)
            if rows > field.max_rows or (
                    not field.as_list and value.shape[1:] != field.row_shape):
                raise ValueError(f"{layout.kind} field {field.name!r}: {rows} rows of "
                                 f"{getattr(value, 'shape', '?')} do not fit "
                                 f"{field.max_rows} x {field.row_shape}")
            view[:rows] = value
            self._u32[rows_at + j] = rows

    def read(self, slot: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of the message in `slot`, arrays viewing the slot; WireError
        if a field's row count is out of its bounds."""
        layout, base = self.layout, self._bases[slot]
        rows_at, ints_at = (base + PREFIX_BYTES) >> 2, (base + layout.ints_offset) >> 3
        meta: dict[str, Any] = {name: self._i64[ints_at + i]
                                for i, name in enumerate(layout.ints)}
        arrays = {}
        for j, (field, view) in enumerate(zip(layout.fields, self._views[slot], strict=True)):
            rows = self._u32[rows_at + j]
            if rows == ABSENT:
                continue
            if rows > field.max_rows:
                raise WireError(f"slot field {field.name!r} with {rows} rows "
                                f"(at most {field.max_rows})")
            if field.as_list:
                meta[field.name] = view[:rows].tolist()
            else:
                arrays[field.name] = view[:rows]
        return meta, arrays

    def release(self) -> None:
        self._views = []
        self._u32.release()
        self._i64.release()
