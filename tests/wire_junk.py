"""Malformed-message material shared by the decoder property tests and the live fuzz test."""

from __future__ import annotations

import msgpack

from srl_jax.wire import codec as wire

DTYPES = sorted(wire.ALLOWED_DTYPES)
KINDS = sorted(wire.KINDS)
BAD_DTYPES = ["|O", "O", "<U4", "|S4", "V8", "|V8", ">f4", ">i8", "<M8[ns]", "<m8[s]", "<c8",
              "<c16", "float32", "f4", "<f4 ", "", "<f3", "<i16", "b1", "?", "[('a', '<f4')]"]
HUGE = [2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def nested(depth: int) -> bytes:
    """A msgpack value `depth` one-element lists deep, packed by hand (packb refuses)."""
    return b"\x91" * depth + b"\xc0"


def header_with_raw_meta(kind: str, raw_meta: bytes, specs: list) -> bytes:
    """A header map whose 'm' value is the given msgpack bytes."""
    return (b"\x84" + msgpack.packb("k") + msgpack.packb(kind) + msgpack.packb("v")
            + msgpack.packb(wire.WIRE_VERSION) + msgpack.packb("m") + raw_meta
            + msgpack.packb("a") + msgpack.packb(specs))
