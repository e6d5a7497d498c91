"""Wire format: a msgpack header frame followed by one raw frame per numpy array.

Every message on every stream is a ZMQ multipart message:

    frame 0: msgpack map {"k": kind, "v": WIRE_VERSION, "m": {scalar metadata},
                          "a": [[name, dtype, shape], ...]}
    frame i: the raw C-order bytes of array i-1

Receivers build arrays with `np.frombuffer` over the ZMQ frame (no copy). Only
plain numeric and boolean dtypes are accepted, so nothing on the wire is ever
unpickled. Anything that does not fit is a `WireError`: receivers count it,
log it once and drop it.

Message kinds (the whole protocol):

| kind            | sender -> receiver            | arrays                                  |
| --------------- | ----------------------------- | --------------------------------------- |
| `infer_request` | actor -> inference server     | obs [n, ...]                            |
| `infer_reply`   | inference server -> actor     | action, logp, value [n]                 |
| `samples`       | actor -> learner or replay    | one trajectory chunk, see actors.chunks |
| `params`        | learner -> inference servers  | one array per parameter leaf            |
| `snapshot`      | learner -> inference servers  | one array per parameter leaf            |
| `stats`         | any worker -> controller      | episode_return, episode_length          |
| `stats_batch`   | host agent -> controller      | `<i>/<name>`: heartbeat i's arrays      |
| `relay_note`    | relay -> the relays below     | none (meta: newest, above)              |
| `sample_request`| learner -> replay server      | none (meta: seq, rows, window)          |
| `sampled`       | replay server -> learner      | a sampled batch (dataflow/replay_spec.py) |
|                 |                               | or none while the rate limiter waits    |
| `priorities`    | learner -> replay server      | slots, generations, priorities [n]      |
| `name_request`  | any worker -> controller      | none (meta: op, id, key, endpoint)      |
| `name_reply`    | controller -> worker          | none, or the run's config (uint8 text)  |
| `name_change`   | controller -> followers       | none (meta: key, endpoint or None)      |
| `log`           | any worker -> controller      | text: output bytes (uint8)              |
| `exploit`       | population manager -> learner | none (meta: member, donor, hyperparams) |
| `exploited`     | learner -> population manager | none (meta: member, ok, version, ...)   |
| `lineage_event` | learner -> controller         | none (meta: id, event: one copy made)   |
| `lineage_request`| population manager -> controller | none                                 |
| `lineage`       | controller -> learner, manager| events: JSON lines (uint8), or none     |
| `metrics_row`   | controller -> population manager | row: one metrics row as JSON (uint8) |

Metadata worth knowing: `samples` carries `actor` and `episode_returns` (the
returns of episodes finished since that actor's previous chunk); `params`
carries `version` and `started_ms` (the learner's start time in ms, so that
a learner restored from a checkpoint wins over the one that died); `snapshot`
(one of a self-play opponent pool) carries those and `pool`, the versions the pool
holds; an `infer_request` to a frozen policy's server carries `opponent` [n] (the
snapshot each row plays) and its reply `opponent` [n] (the one that acted) and
`pool` in its metadata.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

WIRE_VERSION = 1
KINDS = frozenset({"infer_request", "infer_reply", "samples", "params", "stats",
                   "sample_request", "sampled", "priorities", "exploit", "exploited",
                   "name_request", "name_reply", "name_change", "log", "snapshot",
                   "stats_batch", "lineage_event", "lineage_request", "lineage",
                   "metrics_row", "relay_note"})
DTYPES = {
    np.dtype(name).str: np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
}
"""The dtypes the wire carries, by their string (`np.dtype.str`, byte order included)."""
ALLOWED_DTYPES = frozenset(DTYPES)
MAX_HEADER_BYTES = 1 << 16
MAX_ARRAYS = 4096
MAX_DIMS = 8


class WireError(ValueError):
    """A message that does not follow the wire format."""


@dataclass
class Message:
    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def encode(kind: str, meta: dict[str, Any] | None = None,
           arrays: dict[str, np.ndarray] | None = None) -> list[Any]:
    """Frames for `socket.send_multipart(frames, copy=False)`."""
    if kind not in KINDS:
        raise WireError(f"unknown message kind {kind!r}")
    specs, buffers = [], []
    for name, array in (arrays or {}).items():
        array = np.array(array, copy=None, order="C")
        if array.dtype.str not in ALLOWED_DTYPES:
            raise WireError(f"array {name!r} has dtype {array.dtype} that the wire does not carry")
        specs.append([name, array.dtype.str, list(array.shape)])
        buffers.append(array.data if array.size else b"")
    header = msgpack.packb({"k": kind, "v": WIRE_VERSION, "m": meta or {}, "a": specs})
    return [header, *buffers]


def _buffer(frame: Any) -> Any:
    """The frame's bytes as a buffer numpy and msgpack read without a copy."""
    if type(frame) is bytes:
        return frame
    view = memoryview(frame.buffer if hasattr(frame, "buffer") else frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _is_dim(d: Any, max_bytes: int) -> bool:
    return type(d) is int and 0 <= d <= max_bytes


def _check_spec(spec: Any, max_bytes: int) -> tuple[str, np.dtype, tuple[int, ...]]:
    if type(spec) not in (list, tuple) or len(spec) != 3:
        raise WireError("array spec must be [name, dtype, shape]")
    name, dtype_str, shape = spec
    if type(name) is not str:
        raise WireError("array name must be a string")
    dtype = DTYPES.get(dtype_str) if type(dtype_str) is str else None
    if dtype is None:
        raise WireError(f"array {name!r}: dtype {dtype_str!r} not allowed")
    if type(shape) not in (list, tuple) or len(shape) > MAX_DIMS:
        raise WireError(f"array {name!r}: bad shape {shape!r}")
    for d in shape:  # a loop, not all(...): heartbeats bring thousands of small arrays
        if not _is_dim(d, max_bytes):
            raise WireError(f"array {name!r}: bad shape {shape!r}")
    return name, dtype, tuple(shape)


def decode(frames: Sequence[Any], expected: frozenset[str] | None = None,
           max_bytes: int = 1 << 30) -> Message:
    """Parse frames (zmq.Frame, bytes or memoryview) without copying array data."""
    if not frames:
        raise WireError("empty message")
    header_view = _buffer(frames[0])
    if len(header_view) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(header_view)} bytes is too large")
    try:
        header = msgpack.unpackb(header_view, raw=False, strict_map_key=True)
    except Exception as error:
        raise WireError(f"header is not msgpack: {type(error).__name__}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    kind, version = header.get("k"), header.get("v")
    if type(version) is not int or version != WIRE_VERSION:
        raise WireError(f"wire version {version!r}, expected {WIRE_VERSION}")
    if not isinstance(kind, str) or kind not in KINDS or (
            expected is not None and kind not in expected):
        raise WireError(f"unexpected message kind {kind!r}")
    meta, specs = header.get("m", {}), header.get("a", [])
    if not isinstance(meta, dict) or not isinstance(specs, list):
        raise WireError("header fields 'm' and 'a' must be a map and a list")
    if len(specs) > MAX_ARRAYS or len(specs) != len(frames) - 1:
        raise WireError(f"header names {len(specs)} arrays but {len(frames) - 1} frames came")
    arrays = {}
    total = 0
    for spec, frame in zip(specs, frames[1:], strict=True):
        name, dtype, shape = _check_spec(spec, max_bytes)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        total += nbytes
        if total > max_bytes:
            raise WireError(f"message declares more than {max_bytes} bytes")
        view = _buffer(frame)
        if len(view) != nbytes:
            raise WireError(f"array {name!r}: {len(view)} bytes for shape {shape} of {dtype}")
        if name in arrays:
            raise WireError(f"array {name!r} appears twice")
        try:  # a zero-size shape can still have dims whose product numpy refuses
            arrays[name] = np.frombuffer(view, dtype=dtype, count=count).reshape(shape)
        except ValueError as error:
            raise WireError(f"array {name!r}: shape {shape}: {error}") from None
    return Message(kind=kind, meta=meta, arrays=arrays)
