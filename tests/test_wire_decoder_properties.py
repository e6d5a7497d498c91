"""Wire decoder properties: `wire.decode` under random and mutated messages (hypothesis).

Whatever the frames, `decode` returns a well-formed `Message` or raises
`WireError`, never anything else, and it never allocates in proportion to sizes
a header declares. Together the tests generate FUZZ_EXAMPLES (4,000) messages,
about 11 s of one core. No sockets, no processes: tests/test_wire_live_fuzz.py
sends such messages to a real run.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srl_jax.wire import codec as wire
from srl_jax.wire.codec import WireError, decode, encode
from tests.wire_junk import BAD_DTYPES, DTYPES, HUGE, KINDS, header_with_raw_meta, nested

MSGPACK_INTS = st.integers(-(2**63), 2**64 - 1)

ROUND_TRIP_EXAMPLES = 500
MUTATED_EXAMPLES = 1000
RANDOM_HEADER_EXAMPLES = 750
RANDOM_BYTES_EXAMPLES = 1000
HUGE_SIZE_EXAMPLES = 750
FUZZ_EXAMPLES = (ROUND_TRIP_EXAMPLES + MUTATED_EXAMPLES + RANDOM_HEADER_EXAMPLES
                 + RANDOM_BYTES_EXAMPLES + HUGE_SIZE_EXAMPLES)


def fuzz_settings(examples: int) -> settings:
    """No deadline (2 loaded cores), no example database (nothing written to the repo)."""
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example])


# ---------------------------------------------------------------- strategies

JUNK = [None, True, False, 0, 1, -1, 2, 255, 1.0, 1.5, -0.0, math.inf, -math.inf, math.nan,
        *HUGE, -(2**63), "", "x", "k", "samples", "<f4", "\0", "\u00e9", b"", b"\0", b"samples",
        [], [0], [1, 2], [[1]], ["x", "<f4", [1]], ["x", "<f4"], {}, {"a": 1}, {1: 2},
        {b"k": "v"}, {"k": [1, {"m": None}]}, list(range(9)), [None, None, None]]
"""Values of every msgpack type, picked cheaply (recursive strategies are slow on 2 cores)."""
SCALARS = st.one_of(st.none(), st.booleans(), MSGPACK_INTS, st.floats(allow_nan=False),
                    st.text(max_size=6), st.binary(max_size=6))
META_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3),
                        st.dictionaries(st.text(max_size=3), SCALARS, max_size=2))
METAS = st.dictionaries(st.text(max_size=6), META_VALUES, max_size=3)
ANY_KEYS = st.one_of(st.text(max_size=3), st.binary(max_size=3), st.integers(-1, 300))
ANY_VALUES = st.one_of(st.sampled_from(JUNK), SCALARS, st.lists(st.sampled_from(JUNK), max_size=3))
BAD_DIMS = st.one_of(st.integers(-(2**63), -1), st.sampled_from(
    [-1, True, False, 1.5, 2.0, math.nan, math.inf, "2", b"2", None, [1], {}, *HUGE]))


SHAPES = [(), *itertools.product(range(4), repeat=1), *itertools.product(range(4), repeat=2),
          *itertools.product(range(4), repeat=3), (2, 0, 3, 1), (1, 2, 1, 2, 1), (2,) * 6,
          (1, 3, 1, 1, 2, 1, 1), (1,) * wire.MAX_DIMS, (2, 1, 1, 0, 1, 1, 1, 3)]
"""Every shape of up to 3 dims of 0-3, and a few up to MAX_DIMS: one draw, not one per dim."""


@st.composite
def some_arrays(draw: st.DrawFn) -> np.ndarray:
    """Any bit pattern of an allowed dtype (NaN payloads too), sometimes not C-contiguous."""
    dtype = np.dtype(draw(GOOD_DTYPES))
    shape = draw(SMALL_SHAPES)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
    if dtype.kind == "b":
        raw = bytes(b & 1 for b in raw)
    array = np.frombuffer(raw, dtype).reshape(shape)
    return array.T if array.ndim > 1 and draw(st.booleans()) else array


GOOD_DTYPES = st.sampled_from(DTYPES)
SMALL_SHAPES = st.sampled_from(SHAPES)
SOME_ARRAYS = some_arrays()
ARRAY_NAMES = st.lists(st.text(max_size=6), unique=True, max_size=3)


@st.composite
def arrays_maps(draw: st.DrawFn) -> dict[str, np.ndarray]:
    return {name: draw(SOME_ARRAYS) for name in draw(ARRAY_NAMES)}


@st.composite
def valid_messages(draw: st.DrawFn) -> tuple[str, dict, dict[str, np.ndarray]]:
    return draw(st.sampled_from(KINDS)), draw(METAS), draw(arrays_maps())


SPEC_NAMES = st.one_of(st.text(max_size=4), ANY_VALUES)
SPEC_DTYPES = st.one_of(GOOD_DTYPES, st.sampled_from(BAD_DTYPES), ANY_VALUES)
BAD_SHAPES = st.lists(st.one_of(st.integers(0, 4), BAD_DIMS), max_size=wire.MAX_DIMS + 2)
HUGE_SHAPES = st.lists(st.sampled_from([0, 1, 3, *HUGE]), min_size=1, max_size=wire.MAX_DIMS)
SPEC_SHAPES = st.one_of(SMALL_SHAPES.map(list), BAD_SHAPES, HUGE_SHAPES, ANY_VALUES)
SPEC_FORMS = st.sampled_from(["spec", "spec", "spec", "short", "long", "map", "other"])


@st.composite
def bad_specs(draw: st.DrawFn) -> Any:
    """An array spec with at least a chance of every part being wrong."""
    name, dtype, shape = draw(SPEC_NAMES), draw(SPEC_DTYPES), draw(SPEC_SHAPES)
    form = draw(SPEC_FORMS)
    if form == "short":
        return [name, dtype]
    if form == "long":
        return [name, dtype, shape, draw(ANY_VALUES)]
    if form == "map":
        return {"name": name, "dtype": dtype, "shape": shape}
    if form == "other":
        return draw(ANY_VALUES)
    return [name, dtype, shape]


BAD_SPECS = bad_specs()


def declared_nbytes(spec: Any) -> int | None:
    """The byte count a spec declares, if it is plausible enough to build a frame for."""
    with contextlib.suppress(Exception):
        _, dtype, shape = spec
        if all(type(d) is int and d >= 0 for d in shape):
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            if nbytes <= 4096:
                return nbytes
    return None


# ---------------------------------------------------------------- the property

def check_decode(frames: list, expected: frozenset[str] | None = None,
                 max_bytes: int = 1 << 30) -> wire.Message | None:
    """Decode; a WireError gives None, anything else but a well-formed Message fails."""
    try:
        message = decode(frames, expected=expected, max_bytes=max_bytes)
    except WireError:
        return None
    assert isinstance(message, wire.Message)
    assert message.kind in wire.KINDS and (expected is None or message.kind in expected)
    assert isinstance(message.meta, dict)
    assert len(message.arrays) == len(frames) - 1
    total = 0
    for (name, array), frame in zip(message.arrays.items(), frames[1:], strict=True):
        assert isinstance(name, str) and isinstance(array, np.ndarray)
        assert array.dtype.str in wire.ALLOWED_DTYPES and array.ndim <= wire.MAX_DIMS
        assert array.nbytes == len(memoryview(frame).cast("B"))
        total += array.nbytes
    assert total <= max_bytes
    return message


# ---------------------------------------------------------------- property tests

@fuzz_settings(ROUND_TRIP_EXAMPLES)
@given(valid_messages(), st.booleans())
def test_valid_messages_round_trip(message: tuple, as_bytes: bool) -> None:
    kind, meta, arrays = message
    frames = encode(kind, meta, arrays)
    if as_bytes:  # as a receiver's copies, not the sender's memoryviews
        frames = [bytes(frame) for frame in frames]
    decoded = check_decode(frames)
    assert decoded is not None
    assert decoded.kind == kind and decoded.meta == meta
    assert list(decoded.arrays) == list(arrays)
    for name, array in arrays.items():
        got = decoded.arrays[name]
        assert (got.dtype, got.shape) == (array.dtype, array.shape)
        assert got.tobytes() == array.tobytes()  # bit for bit, NaN payloads included


HEADER_MUTATIONS = ["kind", "version", "meta", "specs", "drop-key", "add-key", "spec", "dtype",
                    "shape", "huge-shape", "extra-spec", "duplicate-spec", "bloat", "deep"]
FRAME_MUTATIONS = ["truncate", "extend", "drop", "insert", "duplicate", "flip", "swap"]
HEADER_MUTATION = st.sampled_from(HEADER_MUTATIONS)
FRAME_MUTATION = st.sampled_from(FRAME_MUTATIONS)
KIND_VALUES = st.one_of(st.text(max_size=14), st.sampled_from(
    ["INFER_REQUEST", "sample", "params\0", "stats ", *KINDS]), ANY_VALUES)
VERSION_VALUES = st.one_of(MSGPACK_INTS, st.sampled_from([0, 2, -1, 1.0, True, "1", [1]]),
                           ANY_VALUES)
HEADER_KEYS = st.sampled_from(["k", "v", "m", "a"])
BLOAT_SIZES = st.integers(wire.MAX_HEADER_BYTES - 64, wire.MAX_HEADER_BYTES + 64)
DEPTHS = st.sampled_from([10, 500, 2000, 20000, 60000])
SOME_DTYPES = st.one_of(st.sampled_from(BAD_DTYPES), GOOD_DTYPES)
SOME_SHAPES = st.one_of(SMALL_SHAPES.map(list), BAD_SHAPES)
FRAME_BYTES = st.binary(max_size=64)
EXTRA_BYTES = st.binary(min_size=1, max_size=16)


def mutate_header(data: st.DataObject, header: dict, buffers: list[bytes]) -> bytes | None:
    """Apply one structural mutation; returns packed bytes when it has to pack by hand."""
    mutation = data.draw(HEADER_MUTATION, label="header mutation")
    specs = header.get("a")  # a copy: it may be one of JUNK, or gone
    header["a"] = list(specs) if isinstance(specs, list) else []
    specs = header["a"]
    if mutation == "kind":
        header["k"] = data.draw(KIND_VALUES)
    elif mutation == "version":
        header["v"] = data.draw(VERSION_VALUES)
    elif mutation == "meta":
        header["m"] = data.draw(ANY_VALUES)
    elif mutation == "specs":
        header["a"] = data.draw(ANY_VALUES)
    elif mutation == "drop-key":
        header.pop(data.draw(HEADER_KEYS), None)
    elif mutation == "add-key":
        header[data.draw(st.text(max_size=3))] = data.draw(ANY_VALUES)
    elif mutation == "extra-spec":
        specs.append(data.draw(BAD_SPECS))
    elif mutation == "duplicate-spec" and specs:
        specs.append(specs[data.draw(st.integers(0, len(specs) - 1))])
        if data.draw(st.booleans()):
            buffers.append(buffers[-1] if buffers else b"")
    elif mutation == "bloat":
        size = data.draw(BLOAT_SIZES)
        header["m"] = {"pad": b"\0" * size}
    elif mutation == "deep":
        depth = data.draw(DEPTHS)
        return header_with_raw_meta(str(header.get("k")), nested(depth), specs)
    elif specs:  # "spec", "dtype", "shape", "huge-shape": one array's spec
        i = data.draw(st.integers(0, len(specs) - 1))
        spec = list(specs[i]) if isinstance(specs[i], list) else []
        spec += [None] * (3 - len(spec))
        if mutation == "spec":
            spec = data.draw(BAD_SPECS)
        elif mutation == "dtype":
            spec[1] = data.draw(SOME_DTYPES)
        elif mutation == "shape":
            spec[2] = data.draw(SOME_SHAPES)
        else:
            spec[2] = data.draw(HUGE_SHAPES)
        specs[i] = spec
    return None


def mutate_frames(data: st.DataObject, frames: list[bytes]) -> None:
    mutation = data.draw(FRAME_MUTATION, label="frame mutation")
    if not frames or mutation == "insert":
        frames.insert(data.draw(st.integers(0, len(frames))), data.draw(FRAME_BYTES))
        return
    i = data.draw(st.integers(0, len(frames) - 1))
    frame = frames[i]
    if mutation == "truncate":
        frames[i] = frame[:data.draw(st.integers(0, max(0, len(frame) - 1)))]
    elif mutation == "extend":
        frames[i] = frame + data.draw(EXTRA_BYTES)
    elif mutation == "drop":
        del frames[i]
    elif mutation == "duplicate":
        frames.insert(i, frame)
    elif mutation == "flip" and frame:
        at = data.draw(st.integers(0, len(frame) - 1))
        bit = data.draw(st.integers(1, 255))
        frames[i] = frame[:at] + bytes([frame[at] ^ bit]) + frame[at + 1:]
    elif mutation == "swap" and len(frames) > 1:
        j = data.draw(st.integers(0, len(frames) - 1))
        frames[i], frames[j] = frames[j], frames[i]


EXPECTED = st.one_of(st.none(), st.frozensets(st.sampled_from(KINDS)))
MAX_BYTES = st.sampled_from([1 << 30, 1 << 20, 64, 0])


def base_messages(count: int = 256, seed: int = 0) -> list[list[bytes]]:
    """Valid messages to mutate: every kind and dtype, zero-size and 0-d to 8-d arrays.

    A fixed pool (drawn by index) instead of a strategy: the mutations are what this test
    explores, and drawing whole messages per example would triple its time.
    """
    rng = random.Random(seed)
    metas = [{}, {"version": 3, "started_ms": 1 << 40}, {"split": 1, "seq": 2**63},
             {"worker": "actor-0", "counters": {"env_frames": 1.5}, "pid": 7},
             {"episode_returns": [1.0, -2.5], "actor": 0}]
    pool = []
    for i in range(count):
        arrays = {}
        for j in range(rng.randint(0, 3)):
            dtype, shape = np.dtype(rng.choice(DTYPES)), rng.choice(SHAPES)
            raw = rng.randbytes(math.prod(shape) * dtype.itemsize)
            arrays[f"a{j}"] = np.frombuffer(raw, dtype).reshape(shape)
        frames = encode(KINDS[i % len(KINDS)], rng.choice(metas), arrays)
        pool.append([bytes(frame) for frame in frames])
    return pool


BASE_MESSAGES = base_messages()


@fuzz_settings(MUTATED_EXAMPLES)
@given(st.sampled_from(BASE_MESSAGES), st.data())
def test_mutated_messages_decode_or_raise_wire_error(packed: list[bytes],
                                                     data: st.DataObject) -> None:
    header, buffers = msgpack.unpackb(packed[0]), list(packed[1:])
    raw = None
    for _ in range(data.draw(st.integers(0, 3), label="header mutations")):
        raw = mutate_header(data, header, buffers) or raw
    frames = [raw or msgpack.packb(header), *buffers]
    for _ in range(data.draw(st.integers(0 if raw else 1, 3), label="frame mutations")):
        mutate_frames(data, frames)
    expected = data.draw(EXPECTED)
    max_bytes = data.draw(MAX_BYTES)
    check_decode(frames, expected=expected, max_bytes=max_bytes)


ONE_IN = {n: st.integers(0, n - 1) for n in (4, 5, 6, 10)}
"""`data.draw(ONE_IN[n])` is falsy one time in n."""
META_OR_ANY = st.one_of(METAS, ANY_VALUES)
SPEC_LISTS = st.lists(BAD_SPECS, max_size=3)
EXTRA_KEYS = st.lists(ANY_KEYS, max_size=2)
EXTRA_FRAMES = st.lists(st.binary(max_size=8), max_size=3)


@fuzz_settings(RANDOM_HEADER_EXAMPLES)
@given(st.data())
def test_random_headers_decode_or_raise_wire_error(data: st.DataObject) -> None:
    """Headers of the right general shape with every field drawn at random."""
    header: dict[Any, Any] = {}
    if data.draw(ONE_IN[10]):
        header["k"] = data.draw(KIND_VALUES)
    if data.draw(ONE_IN[10]):
        header["v"] = data.draw(VERSION_VALUES)
    if data.draw(ONE_IN[4]):
        header["m"] = data.draw(META_OR_ANY)
    specs = data.draw(SPEC_LISTS)
    header["a"] = specs if data.draw(ONE_IN[6]) else data.draw(ANY_VALUES)
    for key in data.draw(EXTRA_KEYS):
        header[key] = data.draw(ANY_VALUES)
    frames = [msgpack.packb(header)]
    for spec in specs:  # frames that fit the declared sizes where that is possible
        nbytes = declared_nbytes(spec)
        if nbytes is None or not data.draw(ONE_IN[5]):
            frames.append(data.draw(FRAME_BYTES))
        else:
            frames.append(data.draw(st.binary(min_size=nbytes, max_size=nbytes)))
    if not data.draw(ONE_IN[6]):
        frames.extend(data.draw(EXTRA_FRAMES))
    check_decode(frames)


MSGPACK_PREFIXES = [b"\x84", b"\x84\xa1k", b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff",
                    b"\xc6\x7f\xff\xff\xff", b"\xc7\xff\x01"]
"""A map, a map of 4G entries, an array of 4G items, a 2 GB bin, an extension type."""


@fuzz_settings(RANDOM_BYTES_EXAMPLES)
@given(st.one_of(st.binary(max_size=64), st.sampled_from(MSGPACK_PREFIXES)),
       st.binary(max_size=64), st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes_decode_or_raise_wire_error(prefix: bytes, rest: bytes,
                                                 frames: list[bytes]) -> None:
    """Garbage, some of it starting like a map or a huge container (msgpack must not trust it)."""
    check_decode([prefix + rest, *frames])


@fuzz_settings(HUGE_SIZE_EXAMPLES)
@given(st.lists(st.lists(st.sampled_from([0, 1, 2, 7, 1 << 20, *HUGE]), max_size=wire.MAX_DIMS),
                min_size=1, max_size=2),
       st.lists(GOOD_DTYPES, min_size=2, max_size=2),
       st.lists(st.binary(max_size=16), min_size=2, max_size=2),
       st.sampled_from([1 << 30, 1 << 20, 0]))
def test_huge_declared_sizes_fail_fast_without_allocating(
        shapes: list[list[int]], dtypes: list[str], buffers: list[bytes], max_bytes: int) -> None:
    """A header may declare anything; decode neither allocates nor spends time in proportion."""
    specs = [[f"x{i}", dtype, shape] for i, (shape, dtype) in enumerate(zip(shapes, dtypes,
                                                                            strict=False))]
    frames = [msgpack.packb({"k": "samples", "v": wire.WIRE_VERSION, "m": {}, "a": specs}),
              *buffers[:len(specs)]]
    tracemalloc.start()
    try:  # CPU time of this thread: what decode spends, whatever else runs on the machine
        start = time.thread_time()
        check_decode(frames, max_bytes=max_bytes)
        elapsed = time.thread_time() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"decode allocated {peak} bytes for {specs}"
    assert elapsed < 1.0, f"decode spent {elapsed:.2f}s of CPU for {specs}"


@pytest.mark.parametrize(("shape", "dtype"), [
    ([0, 1 << 30, 1 << 30, 1 << 30], "|u1"),
    ([1 << 30, 1 << 30, 0, 1 << 30, 16], "<f8"),
    ([0, 1 << 30, 1 << 30, 8], "<i2"),
])
def test_zero_size_array_numpy_cannot_shape_is_a_wire_error(shape: list[int], dtype: str) -> None:
    """Found by the fuzzer: a zero-size shape whose other dims overflow numpy's size raised a
    plain ValueError from `reshape`, which `streams.receive` does not catch (a worker died)."""
    frames = [msgpack.packb({"k": "samples", "v": wire.WIRE_VERSION, "m": {},
                             "a": [["x", dtype, shape]]}), b""]
    with pytest.raises(WireError, match="'x'"):
        decode(frames)
