"""Slot layouts: where each part of a message sits in a slot, fixed for a run.

A layout names the message's integer metadata (`ints`: split, seq, version ...) and its
fields: arrays of up to `max_rows` rows of a fixed row shape and dtype (observations,
actions, a chunk's arrays), and metadata lists kept as arrays (a chunk's recent episode
returns, an opponent pool's versions). Both ends build the same layout from the run's
config and the policy's spec (srl_jax/dataflow/shm_layouts.py); the slot file carries
its fingerprint, and a binder maps no file whose layouts are not its own. A message then
needs no header to parse: the only thing read from shared memory that could be wrong is
each field's row count, and one above its `max_rows` is a malformed slot (counted and
dropped). Dtypes and shapes cannot differ; nothing is unpickled.

    slot: stamp u64 | claim u64 | done u64 | reader u32 | 4 spare bytes |
          rows u32 per field (to 8 bytes) | ints i64 each |
          each field's max_rows x row bytes (each from 8 bytes)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from srl_jax.wire.codec import WireError

REQUEST_SLOTS = 2
"""Request slots per split: a request sent again goes to one no server is answering."""

ABSENT = 0xFFFFFFFF
"""A field's row count when the message leaves it out (a policy without a state)."""
PREFIX_BYTES = 32
"""stamp, claim and done u64, reader u32 (srl_jax/wire/shm/slot_file.py)."""


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
    """The wire message kind it carries (srl_jax/wire/codec.py)."""
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
    """One area's slots of one layout, as numpy views into the mapping at `start`; each
    slot's plan (a field's name, view, row-count index, ...) is made once, so a message
    costs a copy per field and little Python besides."""

    def __init__(self, layout: SlotLayout, buffer: Any, start: int, slots: int) -> None:
        self.layout = layout
        self._u32 = memoryview(buffer).cast("I")
        self._i64 = memoryview(buffer).cast("q")
        self._bases = [start + slot * layout.slot_bytes for slot in range(slots)]
        self._ints = [(base + layout.ints_offset) >> 3 for base in self._bases]
        self._plans = [[(f.name, np.ndarray((f.max_rows, *f.row_shape), f.dtype, buffer,
                                            base + offset),
                         ((base + PREFIX_BYTES) >> 2) + j, f.as_list, f.max_rows, f.row_shape)
                        for j, (f, offset) in enumerate(zip(layout.fields, layout.field_offsets,
                                                            strict=True))]
                       for base in self._bases]

    def base(self, slot: int) -> int:
        return self._bases[slot]

    def write(self, slot: int, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
              ) -> None:
        """The message's parts into `slot` (ValueError: it does not fit the layout)."""
        u32, i64, at = self._u32, self._i64, self._ints[slot]
        for name in self.layout.ints:
            i64[at] = meta[name]
            at += 1
        for name, view, rows_at, as_list, max_rows, row_shape in self._plans[slot]:
            value = meta.get(name) if as_list else arrays.get(name)
            if value is None:
                u32[rows_at] = ABSENT
                continue
            rows = len(value)
            if rows > max_rows or (not as_list and value.shape[1:] != row_shape):
                raise ValueError(f"{self.layout.kind} field {name!r}: {rows} rows of "
                                 f"{getattr(value, 'shape', '?')} do not fit "
                                 f"{max_rows} x {row_shape}")
            view[:rows] = value
            u32[rows_at] = rows

    def read(self, slot: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of the message in `slot`, arrays viewing the slot; WireError
        if a field's row count is out of its bounds."""
        u32, i64, at = self._u32, self._i64, self._ints[slot]
        meta: dict[str, Any] = {}
        for name in self.layout.ints:
            meta[name] = i64[at]
            at += 1
        arrays = {}
        for name, view, rows_at, as_list, max_rows, _ in self._plans[slot]:
            rows = u32[rows_at]
            if rows == ABSENT:
                continue
            if rows > max_rows:
                raise WireError(f"slot field {name!r} with {rows} rows (at most {max_rows})")
            if as_list:
                meta[name] = view[:rows].tolist()
            else:
                arrays[name] = view[:rows]
        return meta, arrays

    def release(self) -> None:
        self._plans = []
        self._u32.release()
        self._i64.release()
