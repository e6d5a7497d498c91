"""Wire fuzzing: the decoder under random and mutated messages, and a live run under fire.

The property tests (hypothesis) hold `wire.decode` to its contract: whatever the
frames, it returns a well-formed `Message` or raises `WireError`, never anything
else, and it never allocates in proportion to sizes a header declares. Together
they generate FUZZ_EXAMPLES (8,000) messages, about 45 s of one core.

The live test starts a real run and sends a few thousand malformed messages
(3,774 with seed 8) to every endpoint the run advertises in `<run>/names/`, with
every socket type that can connect, and raw TCP below ZMQ; no process may die or
restart, memory stays flat, and the workers count every message they drop in
`system/wire_rejected`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import socket as pysocket
import struct
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srl_jax import streams, wire
from srl_jax.run_dir import read_status
from srl_jax.wire import WireError, decode, encode
from tests.conftest import Processes, all_running, read_metrics, wait_for

DTYPES = sorted(wire.ALLOWED_DTYPES)
KINDS = sorted(wire.KINDS)
BAD_DTYPES = ["|O", "O", "<U4", "|S4", "V8", "|V8", ">f4", ">i8", "<M8[ns]", "<m8[s]", "<c8",
              "<c16", "float32", "f4", "<f4 ", "", "<f3", "<i16", "b1", "?", "[('a', '<f4')]"]
HUGE = [2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
MSGPACK_INTS = st.integers(-(2**63), 2**64 - 1)

ROUND_TRIP_EXAMPLES = 1000
MUTATED_EXAMPLES = 2000
RANDOM_HEADER_EXAMPLES = 1500
RANDOM_BYTES_EXAMPLES = 2000
HUGE_SIZE_EXAMPLES = 1500
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


def nested(depth: int) -> bytes:
    """A msgpack value `depth` one-element lists deep, packed by hand (packb refuses)."""
    return b"\x91" * depth + b"\xc0"


def header_with_raw_meta(kind: str, raw_meta: bytes, specs: list) -> bytes:
    """A header map whose 'm' value is the given msgpack bytes."""
    return (b"\x84" + msgpack.packb("k") + msgpack.packb(kind) + msgpack.packb("v")
            + msgpack.packb(wire.WIRE_VERSION) + msgpack.packb("m") + raw_meta
            + msgpack.packb("a") + msgpack.packb(specs))


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
    metas = [{}, {"version": 3, "incarnation": 1 << 40}, {"split": 1, "seq": 2**63},
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
    try:
        start = time.perf_counter()
        check_decode(frames, max_bytes=max_bytes)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"decode allocated {peak} bytes for {specs}"
    assert elapsed < 1.0, f"decode took {elapsed:.2f}s for {specs}"


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


def test_receive_skips_a_burst_of_malformed_messages() -> None:
    """Found by the live test: `receive` returned None for a malformed message as for an
    empty socket, so `while receive(...) is not None` loops (the controller, the learner,
    the param stream) took one bad message per turn and real traffic queued behind it."""
    context = zmq.Context.instance()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        pull.bind("inproc://fuzz-receive")
        push.connect("inproc://fuzz-receive")
        rejects = streams.RejectCounter()
        expected = frozenset({"samples"})
        for burst in (100, streams.MAX_SKIPPED + 5):
            before = rejects.count
            for i in range(burst):
                push.send_multipart([b"\xc1", str(i).encode()])
            streams.send(push, "samples", {"burst": burst})
            received = streams.receive(pull, expected, rejects)
            if burst > streams.MAX_SKIPPED:  # a flood is cut into bounded turns
                assert received is None and rejects.count - before == streams.MAX_SKIPPED
                received = streams.receive(pull, expected, rejects)
            assert received is not None and received[1].meta == {"burst": burst}
            assert rejects.count - before == burst
        assert streams.receive(pull, expected, rejects) is None  # nothing waiting
    finally:
        push.close(linger=0)
        pull.close(linger=0)


# ---------------------------------------------------------------- the live test

LIVE_WALL_S = 50.0
"""The run's stop.wall_time_s. Startup and warm-up took 15-25 s on 2 (loaded) cores, the
fuzzing about 4 s; it must end LIVE_DRAIN_S before the run does."""
LIVE_DRAIN_S = 15.0
LIVE_MIN_SENT = 2000
SEND_TIMEOUT_MS = 3000
RSS_JUMP_MB = 50.0
CONTROLLER = "controller/stats"
ENDPOINT_KINDS = {"inference": frozenset({"infer_request"}), "learner/samples": frozenset(
    {"samples"}), CONTROLLER: frozenset({"stats"})}


def endpoint_role(key: str) -> str:
    for role in ("inference", "learner/samples", "learner/params", "controller/stats"):
        if key == role or key.startswith(role + "/"):
            return role
    return "unknown"


def read_endpoints(run_dir: Path) -> dict[str, str]:
    """Every endpoint in the run's FileNameService directory, by key."""
    return {path.name.replace("__", "/"): path.read_text().strip()
            for path in (run_dir / "names").iterdir() if ".tmp" not in path.name}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class LiveFuzzer:
    """Malformed messages, built for one endpoint and classified before they are sent.

    A message counts as `expected` only if the receiving worker must drop and count it:
    `decode` refuses it, or it is the endpoint's kind with an `obs` array the worker cannot
    take (inference: not [n>0, 4] float32; learner: not the chunk's [33, 8, 4] float32).
    """

    OBS_TAIL = (4,)  # CartPole
    CHUNK_OBS = (33, 8, 4)  # trajectory_length + 1, envs // splits, obs

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def _array(self) -> np.ndarray:
        dtype = np.dtype(self.rng.choice(DTYPES))
        shape = tuple(self.rng.randint(0, 4) for _ in range(self.rng.randint(0, 3)))
        return np.frombuffer(self._bytes(math.prod(shape) * dtype.itemsize), dtype).reshape(shape)

    def _wrong_obs(self, role: str) -> np.ndarray | None:
        choice = self.rng.randrange(6)
        n = self.rng.randint(1, 8)
        if choice == 0:
            return None
        if choice == 1:
            return np.zeros((n, 5), np.float32)  # wrong width
        if choice == 2:
            return np.zeros((n, 4), np.float64)  # wrong dtype
        if choice == 3:
            return np.zeros((0, 4), np.float32)  # no rows
        if choice == 4:
            return np.zeros((n,), np.float32)  # wrong rank
        return np.zeros((*self.CHUNK_OBS[:2], 5) if role == "learner/samples" else (n, 4, 1),
                        np.float32)

    def _valid_kinds_wrong_shapes(self, role: str) -> list[Any]:
        kind = {"inference": "infer_request", "learner/samples": "samples"}.get(role, "stats")
        arrays: dict[str, np.ndarray] = {}
        if role == "learner/samples":
            arrays = {name: np.zeros((32, 8), np.float32) for name in (
                "actions", "logp", "rewards", "trunc_values", "versions")}
            arrays["values"] = np.zeros((33, 8), np.float32)
            arrays["terminated"] = arrays["truncated"] = np.zeros((32, 8), bool)
        obs = self._wrong_obs(role)
        if obs is not None:
            arrays["obs"] = obs
        meta = {"split": self.rng.randint(0, 3), "seq": self.rng.randint(0, 1 << 40),
                "episode_returns": [float("nan")], "actor": [1]}
        return encode(kind, meta, arrays)

    def _bad_header(self) -> list[Any]:
        header: dict[Any, Any] = {"k": self.rng.choice(KINDS), "v": wire.WIRE_VERSION, "m": {},
                                  "a": []}
        field = self.rng.choice(["k", "v", "m", "a", "keys"])
        junk = [None, True, 1.5, -1, 2**64 - 1, "x", b"samples", [1, 2], {"a": 1}, {1: 2}]
        if field == "k":
            header["k"] = self.rng.choice([*junk, "bogus", "INFER_REQUEST", "params\0", ""])
        elif field == "v":
            header["v"] = self.rng.choice([*junk, 0, 2, 255, "1", 1.0])
        elif field == "m":
            header["m"] = self.rng.choice(junk)
        elif field == "a":
            header["a"] = self.rng.choice([*junk, [[1, 2, 3]], [["x", "<f4"]]])
        else:
            header = self.rng.choice([[1, 2], "header", {1: "samples"}, {b"k": "samples"}])
        return [msgpack.packb(header), *[self._bytes(4) for _ in range(self.rng.randint(0, 2))]]

    def _bad_arrays(self) -> list[Any]:
        kind = self.rng.choice(KINDS)
        n = self.rng.randint(1, 3)
        specs = [[f"a{i}", self.rng.choice(DTYPES), [self.rng.randint(0, 3)]] for i in range(n)]
        buffers = [self._bytes(d[2][0] * np.dtype(d[1]).itemsize) for d in specs]
        i = self.rng.randrange(n)
        what = self.rng.randrange(8)
        if what == 0:
            specs[i][1] = self.rng.choice(BAD_DTYPES)
        elif what == 1:
            specs[i][2] = [self.rng.choice([-1, True, 1.5, "2", None, 2**40, 2**64 - 1])]
        elif what == 2:
            buffers[i] += b"\0"  # the buffer disagrees with the shape
        elif what == 3:
            specs[i][2] = [self.rng.choice(HUGE[2:]), self.rng.randint(1, 3)]
        elif what == 4:
            specs[i][2] = [0, 1 << 30, 1 << 30, 1 << 30]  # zero-size, numpy refuses the shape
            specs[i][1], buffers[i] = "|u1", b""
        elif what == 5:
            specs.append(["extra", "<f4", [1]])  # more arrays declared than frames
        elif what == 6:
            specs.append(list(specs[i]))
            buffers.append(buffers[i])  # a duplicate name
        else:
            specs[i][2] = [1] * (wire.MAX_DIMS + 1)
            specs[i][1], buffers[i] = "|u1", b"\0"
        return [msgpack.packb({"k": kind, "v": wire.WIRE_VERSION, "m": {}, "a": specs}), *buffers]

    def _mutated(self, role: str) -> list[Any]:
        frames = [bytes(f) for f in self._valid_kinds_wrong_shapes(role)]
        for _ in range(self.rng.randint(1, 3)):
            i = self.rng.randrange(len(frames))
            frame, op = frames[i], self.rng.randrange(4)
            if op == 0 and frame:
                at = self.rng.randrange(len(frame))
                frames[i] = frame[:at] + bytes([frame[at] ^ self.rng.randint(1, 255)]) + \
                    frame[at + 1:]
            elif op == 1:
                frames[i] = frame[:self.rng.randint(0, len(frame))]
            elif op == 2 and len(frames) > 1:
                del frames[i]
            else:
                frames.insert(i, self._bytes(self.rng.randint(0, 16)))
        return frames

    def _other_kind(self, role: str) -> list[Any]:
        own = ENDPOINT_KINDS.get(role, frozenset())
        kind = self.rng.choice([k for k in KINDS if k not in own])
        return encode(kind, {"version": 1, "worker": "fuzz"}, {"x": self._array()})

    def _special(self) -> list[Any]:
        choice = self.rng.randrange(3)
        if choice == 0:
            return [b"\0" * (wire.MAX_HEADER_BYTES + 1)]
        if choice == 1:
            return [header_with_raw_meta("samples", nested(self.rng.choice([2000, 60000])), [])]
        return [msgpack.packb({"k": "stats", "v": 1, "m": {"pad": b"\0" * (1 << 16)}, "a": []})]

    def message(self, role: str) -> list[Any]:
        pick = self.rng.randrange(100)
        if pick < 15:
            return [self._bytes(self.rng.randint(0, 200)) for _ in range(self.rng.randint(1, 4))]
        if pick < 30:
            return self._bad_header()
        if pick < 50:
            return self._bad_arrays()
        if pick < 70:
            return self._mutated(role)
        if pick < 80:
            return self._other_kind(role)
        if pick < 97:
            return self._valid_kinds_wrong_shapes(role)
        return self._special()

    def rejected(self, role: str, frames: list[Any]) -> bool:
        """Whether the worker behind `role` must drop (and count) this message."""
        try:
            message = decode(frames, expected=ENDPOINT_KINDS.get(role))
        except WireError:
            return True
        if role not in ("inference", "learner/samples"):
            return False  # the controller drops what it cannot use without counting it
        obs = message.arrays.get("obs")
        if obs is None or obs.dtype != np.float32:
            return True
        if role == "learner/samples":
            return obs.shape != self.CHUNK_OBS
        return obs.ndim != 2 or obs.shape[1:] != self.OBS_TAIL or obs.shape[0] == 0

    def forged_heartbeats(self, workers: list[dict]) -> list[list[Any]]:
        """Stats in a live worker's name and pid carrying what the metrics cannot take:
        a counter name that is not a string, episode arrays that are not 1-d or disagree."""
        bad_arrays = [
            {"episode_return": np.zeros((2, 2), np.float32),
             "episode_length": np.zeros((2, 2), np.int32)},
            {"episode_return": np.zeros((), np.float32), "episode_length": np.zeros((), np.int32)},
            {"episode_return": np.zeros(3, np.float32), "episode_length": np.zeros(2, np.int32)},
            {"policy_return/x": np.zeros((2, 2), np.float32)},
            {"eval_return": np.zeros((1, 1), np.float32)},
        ]
        out = []
        for worker in workers:
            meta = {"worker": worker["name"], "kind": worker["kind"], "pid": worker["pid"],
                    "phase": "running"}
            out.append(encode("stats", {**meta, "counters": {b"not-a-str": 1.0}}))
            out += [encode("stats", {**meta, "counters": {}}, arrays) for arrays in bad_arrays]
        return out

    def counted_messages(self, role: str, count: int) -> list[list[Any]]:
        """`count` messages the worker must reject (others are drawn again)."""
        out: list[list[Any]] = []
        while len(out) < count:
            frames = self.message(role)
            if frames and self.rejected(role, frames):
                out.append(frames)
        return out


def zmtp_greeting(mechanism: bytes = b"NULL", major: int = 3) -> bytes:
    return (b"\xff" + b"\0" * 8 + b"\x7f" + bytes([major, 0]) + mechanism.ljust(20, b"\0")
            + b"\0" + b"\0" * 31)


def zmtp_ready(socket_type: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return b"\x04" + bytes([len(body)]) + body


def raw_payloads(socket_type: bytes, rng: random.Random) -> list[bytes]:
    """Below ZMQ: garbage, bad greetings, and frames that declare absurd sizes."""
    return [
        rng.randbytes(rng.randint(1, 4096)),  # no greeting: parsed as ZMTP/1.0 frames
        zmtp_greeting(major=9) + rng.randbytes(64),
        zmtp_greeting(b"CURVE") + rng.randbytes(200),
        zmtp_greeting(b"BOGUS"),
        zmtp_greeting() + rng.randbytes(300),
        zmtp_greeting() + zmtp_ready(b"PAIR"),
        *[zmtp_greeting() + zmtp_ready(socket_type) + b"\x02" + struct.pack(">Q", size)
          + b"\x81\xa1k" for size in (1 << 32, 1 << 40, 1 << 62, (1 << 64) - 1)],
        zmtp_greeting() + zmtp_ready(socket_type) + b"\x00\x40" + b"\x84",  # truncated frame
    ]


def send_raw(endpoint: str, payloads: list[bytes]) -> None:
    """One TCP connection per payload (refused ones too: the checks after say who died)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    for payload in payloads:
        with contextlib.suppress(OSError), \
                pysocket.create_connection((host, int(port)), timeout=2) as connection:
            connection.sendall(payload)
            time.sleep(0.01)


def delivered_by_raw(payloads: list[bytes], kind: int) -> int:
    """How many messages these bytes make a socket of `kind` deliver, counted on a stand-in.

    libzmq still speaks ZMTP/1.0 to a peer that sends no greeting, so random bytes
    are parsed as frames and some arrive as (malformed) messages.
    """
    context = zmq.Context()
    sock = context.socket(kind)
    try:
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        send_raw(f"tcp://127.0.0.1:{port}", payloads)
        count = 0
        while sock.poll(300):
            sock.recv_multipart()
            count += 1
        return count
    finally:
        sock.close(linger=0)
        context.term()


def send_all(sock: zmq.Socket, messages: list[list[Any]], deadline: float) -> int:
    """Send until done or past `deadline`; returns how many went out."""
    for sent, frames in enumerate(messages):
        if time.time() > deadline:
            return sent
        try:
            sock.send_multipart(frames, copy=False)
        except zmq.Again:
            return sent
    return len(messages)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text().splitlines()[-lines:])


def heartbeats_fresh(run_dir: Path, max_age_s: float) -> bool:
    """Whether the controller's status shows every worker's heartbeat within `max_age_s`."""
    status = read_status(run_dir) or {}
    return bool(status) and all(status["updated"] - (w["last_heartbeat"] or 0) < max_age_s
                                for w in status["workers"])


def last_row(run_dir: Path) -> dict:
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    return rows[-1] if rows else {}


@pytest.mark.slow
def test_live_run_survives_thousands_of_malformed_messages(processes: Processes,
                                                           tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = processes.start(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir", str(run_dir),
         "--quiet", "--set", "stop.target_return=null", "--set", f"stop.wall_time_s={LIVE_WALL_S}",
         "--set", "checkpoint.enabled=false"],
        log=tmp_path / "launch.log")
    wait_for(lambda: all_running(run_dir) or process.poll() is not None, 90, "all workers running")
    wait_for(lambda: last_row(run_dir).get("learner_steps", 0) >= 2 or process.poll() is not None,
             60, "the learner's first updates (compiled: memory settles)")
    assert process.poll() is None, (tmp_path / "launch.log").read_text()
    before = read_status(run_dir)
    pids = {w["name"]: w["pid"] for w in before["workers"]}
    pids["controller"] = before["controller_pid"]
    rss_before = {name: rss_mb(pid) for name, pid in pids.items()}
    base = last_row(run_dir)["system/wire_rejected"]
    endpoints = read_endpoints(run_dir)
    roles = {key: endpoint_role(key) for key in endpoints}
    assert sorted(roles.values()) == ["controller/stats", "inference", "learner/params",
                                      "learner/samples"], endpoints
    deadline = before["started"] + LIVE_WALL_S - LIVE_DRAIN_S

    fuzz_start = time.time() - before["started"]
    fuzzer = LiveFuzzer(seed=8)
    context = zmq.Context()
    sockets: list[zmq.Socket] = []

    def connect(kind: int, endpoint: str, **options: Any) -> zmq.Socket:
        sock = context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        sock.connect(endpoint)
        sockets.append(sock)
        return sock

    counted = 0  # messages a worker must count in wire_rejected
    to_controller = 0  # messages the controller should count (its count may not be in the row)
    sent: dict[str, int] = {}  # every message sent, by endpoint and socket type
    try:
        subscriber = connect(zmq.SUB, endpoints["learner/params"], SUBSCRIBE=b"")
        for key, endpoint in sorted(endpoints.items(), key=lambda item: item[0] == CONTROLLER):
            role = roles[key]
            if role == "inference":  # a ROUTER: DEALERs (one with its own id) and REQs
                for options in ({}, {"ROUTING_ID": b"fuzz"}):
                    dealer = connect(zmq.DEALER, endpoint, **options)
                    n = send_all(dealer, fuzzer.counted_messages(role, 700), deadline)
                    counted += n
                    sent[f"{key} DEALER"] = sent.get(f"{key} DEALER", 0) + n
                req = connect(zmq.REQ, endpoint, REQ_RELAXED=1)
                n = 0
                for frames in fuzzer.counted_messages(role, 200):  # arrives after an empty frame
                    if time.time() > deadline:
                        break
                    req.send_multipart(frames, copy=False)
                    n += 1
                counted += n
                sent[f"{key} REQ"] = n
            elif role == "learner/samples":  # a PULL: PUSH
                push = connect(zmq.PUSH, endpoint)
                n = send_all(push, fuzzer.counted_messages(role, 1400), deadline)
                counted += n
                sent[f"{key} PUSH"] = n
            elif role == "controller/stats":  # a PULL: PUSH (last: it judges the others)
                push = connect(zmq.PUSH, endpoint)
                messages = [fuzzer.message(role) for _ in range(500)]
                to_controller += sum(fuzzer.rejected(role, m) for m in messages)
                messages += [encode("stats", {"worker": worker, "pid": 1, "counters": {}})
                             for worker in ([1], {"a": 1}, None, 3.5, b"actor-0", "actor-9")]
                forged = fuzzer.forged_heartbeats(before["workers"])
                to_controller += len(forged)
                sent[f"{key} PUSH"] = send_all(push, messages + forged, deadline)
            elif role == "learner/params":  # a PUB only sends: a SUB listens (above), and an
                xsub = connect(zmq.XSUB, endpoint)  # XSUB sends it junk subscriptions
                junk = [b"\x01" + fuzzer._bytes(fuzzer.rng.randint(0, 32)) for _ in range(100)]
                junk += [fuzzer._bytes(fuzzer.rng.randint(0, 32)) for _ in range(100)]
                sent[f"{key} XSUB"] = send_all(xsub, [[j] for j in junk], deadline)
            # Incompatible types: ZMTP refuses them in the handshake, nothing is delivered.
            wrong = connect(zmq.PAIR if role == "learner/params" else zmq.PUB, endpoint)
            with contextlib.suppress(zmq.Again):
                for _ in range(20):
                    wrong.send_multipart(fuzzer.message(role), flags=zmq.NOBLOCK)
            socket_type = {"inference": b"DEALER", "learner/params": b"SUB"}.get(role, b"PUSH")
            payloads = raw_payloads(socket_type, fuzzer.rng)
            if role != "learner/params":  # a PUB reads subscriptions only
                delivered = delivered_by_raw(payloads, zmq.ROUTER if role == "inference"
                                             else zmq.PULL)
                if role == CONTROLLER:
                    to_controller += delivered
                else:
                    counted += delivered
            send_raw(endpoint, payloads)
            sent[f"{key} raw tcp"] = len(payloads)
        total_sent = sum(sent.values())
        fuzz_end = time.time() - before["started"]
        # The controller takes heartbeats through the flood: it neither stops nor falls behind.
        wait_for(lambda: heartbeats_fresh(run_dir, 3.0) or process.poll() is not None, 10,
                 "fresh heartbeats of every worker after the flood")
        assert process.poll() is None, tail(tmp_path / "launch.log")
        assert total_sent >= LIVE_MIN_SENT, f"the fuzzing was cut short at its deadline: {sent}"

        # The workers drain what was sent; a param message still reaches subscribers.
        lower = int(0.9 * counted)
        wait_for(lambda: last_row(run_dir).get("system/wire_rejected", 0) - base >= lower
                 or process.poll() is not None, 20, f"{lower} rejects counted")
        assert process.poll() is None, tail(tmp_path / "launch.log")
        assert subscriber.poll(5000), "no parameters published after the fuzzing"
        assert decode(subscriber.recv_multipart(), frozenset({"params"})).meta["version"] >= 1
        rss_after = {name: rss_mb(pid) for name, pid in pids.items()}
    finally:
        for sock in sockets:
            sock.close()
        context.term()

    assert process.wait(timeout=LIVE_WALL_S + 60) == 0, tail(tmp_path / "launch.log")
    final = read_status(run_dir)
    assert final["state"] == "finished" and "wall time" in final["stop_reason"], final
    assert final["controller_pid"] == pids["controller"]
    for record in final["workers"]:
        assert record["restarts"] == 0, record
        assert record["pid"] == pids[record["name"]], record
    rejected = read_metrics(run_dir)[-1]["system/wire_rejected"] - base
    # Every counted message goes over a stream that does not drop on the way in (a PULL or
    # ROUTER stops reading at its high-water mark, it never discards), and the fuzzer waited
    # for the counts before closing its sockets; 10% slack covers a message still queued then.
    # The controller's own drops may or may not be in the row: they only widen the upper bound.
    assert 0.9 * counted <= rejected <= counted + to_controller, (rejected, counted, sent)
    jumps = {name: round(rss_after[name] - rss_before[name], 1) for name in pids}
    assert all(jump < RSS_JUMP_MB for jump in jumps.values()), jumps
    print(f"live fuzz: sent {total_sent} ({sent}); wire_rejected grew by {rejected}: workers "
          f"must count {counted}, the controller {to_controller}; RSS change MB {jumps}; "
          f"fuzzing from {fuzz_start:.1f}s to {fuzz_end:.1f}s of the run")
