"""The wire format: round trips, and every way a message can be refused (always a WireError)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq

from srl_jax.runtime.worker_base import Worker
from srl_jax.wire import codec as wire
from srl_jax.wire import streams
from srl_jax.wire.codec import WireError, decode, encode
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import make_socket
from tests.conftest import make_config

DTYPES = sorted(wire.ALLOWED_DTYPES)
TIMEOUT_MS = 5000


def sample_array(dtype_str: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random values that use the dtype's range (signs, large magnitudes, bools)."""
    dtype = np.dtype(dtype_str)
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 1000).astype(dtype)


def check_same(decoded: np.ndarray, original: np.ndarray) -> None:
    assert decoded.dtype == original.dtype
    assert decoded.shape == original.shape
    np.testing.assert_array_equal(decoded, original)


# ---------------------------------------------------------------- round trips

LAYOUTS = [
    pytest.param("scalar", id="scalar-0d"),
    pytest.param("empty", id="empty-0x3"),
    pytest.param("vector", id="vector-7"),
    pytest.param("multidim", id="multidim-2x3x4"),
    pytest.param("transposed", id="transposed-non-contiguous"),
    pytest.param("strided", id="strided-slice"),
]


def layout(kind: str, dtype_str: str) -> np.ndarray:
    if kind == "scalar":
        return sample_array(dtype_str, ())
    if kind == "empty":
        return sample_array(dtype_str, (0, 3))
    if kind == "vector":
        return sample_array(dtype_str, (7,))
    if kind == "multidim":
        return sample_array(dtype_str, (2, 3, 4))
    if kind == "transposed":
        array = sample_array(dtype_str, (3, 5)).T
        assert not array.flags.c_contiguous
        return array
    array = sample_array(dtype_str, (4, 10))[:, ::3]
    assert not array.flags.c_contiguous
    return array


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dtype_str", DTYPES)
def test_round_trip_every_dtype_and_layout(dtype_str: str, kind: str) -> None:
    original = layout(kind, dtype_str)
    meta = {"seq": 3, "split": 1, "name": "ab", "ratio": 0.25, "flag": True, "none": None,
            "nested": {"list": [1, 2, 3]}}
    message = decode(encode("samples", meta, {"x": original}))
    assert message.kind == "samples"
    assert message.meta == meta
    assert list(message.arrays) == ["x"]
    check_same(message.arrays["x"], original)


def test_round_trip_many_arrays_keeps_order_and_no_arrays() -> None:
    arrays = {f"a{i}": sample_array(dtype_str, (i % 3 + 1, 2), seed=i)
              for i, dtype_str in enumerate(DTYPES)}
    message = decode(encode("params", {"version": 7}, arrays))
    assert list(message.arrays) == list(arrays)
    for name, array in arrays.items():
        check_same(message.arrays[name], array)
    empty = decode(encode("stats"))
    assert (empty.kind, empty.meta, empty.arrays) == ("stats", {}, {})


@pytest.fixture
def push_pull() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context.instance()
    pull = streams.make_socket(context, zmq.PULL)
    port = pull.bind_to_random_port(f"tcp://{streams.LOOPBACK}")
    push = streams.make_socket(context, zmq.PUSH)
    push.connect(f"tcp://{streams.LOOPBACK}:{port}")
    yield push, pull
    push.close()
    pull.close()


def receive_one(socket: zmq.Socket, expected: frozenset[str],
                rejects: streams.RejectCounter, envelope: int = 0):
    """Wait for one message to be waiting, then take it with streams.receive."""
    assert socket.poll(TIMEOUT_MS), "no message arrived"
    return streams.receive(socket, expected, rejects, envelope=envelope)


def test_round_trip_over_zmq_without_copies(push_pull) -> None:
    push, pull = push_pull
    arrays = {f"{dtype_str}-{kind}": layout(kind, dtype_str)
              for dtype_str in DTYPES for kind in ("empty", "multidim", "transposed")}
    arrays["big"] = sample_array("<f4", (256, 1024))  # 1 MiB: above any inline-copy threshold
    meta = {"version": 12, "worker": "learner-0"}
    streams.send(push, "params", meta, arrays)
    rejects = streams.RejectCounter()
    received = receive_one(pull, frozenset({"params"}), rejects)
    assert received is not None
    routing, message = received
    assert routing == []
    assert rejects.count == 0
    assert message.kind == "params"
    assert message.meta == meta
    assert list(message.arrays) == list(arrays)
    for name, array in arrays.items():
        decoded = message.arrays[name]
        check_same(decoded, array)
        assert not decoded.flags.owndata and decoded.base is not None, name


# ---------------------------------------------------------------- encode refuses

@pytest.mark.parametrize("array", [
    pytest.param(np.array([object(), 1], dtype=object), id="object"),
    pytest.param(np.array(["abcd"]), id="unicode"),
    pytest.param(np.array([b"ab"]), id="bytes"),
    pytest.param(np.zeros(2, dtype="V8"), id="void"),
    pytest.param(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), id="structured"),
    pytest.param(np.zeros(2, dtype="datetime64[ns]"), id="datetime"),
    pytest.param(np.zeros(2, dtype=">f4"), id="big-endian"),
    pytest.param(np.zeros(2, dtype=np.complex64), id="complex"),
])
def test_encode_rejects_dtypes_the_wire_does_not_carry(array: np.ndarray) -> None:
    with pytest.raises(WireError, match="dtype"):
        encode("samples", {}, {"x": array})


@pytest.mark.parametrize("kind", ["bogus", "", "INFER_REQUEST"])
def test_encode_rejects_unknown_kinds(kind: str) -> None:
    with pytest.raises(WireError, match="kind"):
        encode(kind, {}, {})


# ---------------------------------------------------------------- decode refuses

DROP = object()
F4 = np.dtype("<f4").str


def header(**fields) -> bytes:
    """A valid header of kind 'samples' without arrays; `fields` replace (DROP removes) keys."""
    values = {"k": "samples", "v": wire.WIRE_VERSION, "m": {}, "a": []}
    values.update(fields)
    return msgpack.packb({k: v for k, v in values.items() if v is not DROP})


def one_array(spec_shape, dtype_str: str = F4, nbytes: int = 0, name: str = "x") -> list:
    return [header(a=[[name, dtype_str, spec_shape]]), b"\0" * nbytes]



BAD_MESSAGES = [
    pytest.param([], {}, id="no-frames"),
    pytest.param([b""], {}, id="empty-header"),
    pytest.param([b"\xc1"], {}, id="header-not-msgpack"),
    pytest.param([b"\x85\xa1k"], {}, id="header-truncated-msgpack"),
    pytest.param([header() + b"x"], {}, id="header-trailing-bytes"),
    pytest.param([msgpack.packb({1: "samples"})], {}, id="header-int-map-key"),
    pytest.param([b"\0" * (wire.MAX_HEADER_BYTES + 1)], {}, id="header-too-large"),
    pytest.param([msgpack.packb(["samples", 1, {}, []])], {}, id="header-is-list"),
    pytest.param([msgpack.packb("samples")], {}, id="header-is-str"),
    pytest.param([msgpack.packb(None)], {}, id="header-is-nil"),
    pytest.param([msgpack.packb(1)], {}, id="header-is-int"),
    pytest.param([header(v=wire.WIRE_VERSION + 1)], {}, id="version-newer"),
    pytest.param([header(v=0)], {}, id="version-zero"),
    pytest.param([header(v=str(wire.WIRE_VERSION))], {}, id="version-str"),
    pytest.param([header(v=DROP)], {}, id="version-missing"),
    pytest.param([header(k="bogus")], {}, id="kind-unknown"),
    pytest.param([header(k=DROP)], {}, id="kind-missing"),
    pytest.param([header(k=7)], {}, id="kind-int"),
    pytest.param([header(k=b"samples")], {}, id="kind-bytes"),
    pytest.param([header(k=["samples"])], {}, id="kind-list"),
    pytest.param([header(k={"a": 1})], {}, id="kind-map"),
    pytest.param([header()], {"expected": frozenset({"infer_request"})},
                 id="kind-not-expected"),
    pytest.param([header(m=[1])], {}, id="meta-not-map"),
    pytest.param([header(m=None)], {}, id="meta-nil"),
    pytest.param([header(a={"x": 1})], {}, id="specs-not-list"),
    pytest.param([header(), b"\0" * 4], {}, id="more-frames-than-specs"),
    pytest.param([header(a=[["x", F4, [1]]])], {}, id="fewer-frames-than-specs"),
    pytest.param([header(a=[["x", F4, [1]], ["y", F4, [1]]]), b"\0" * 4], {},
                 id="two-specs-one-frame"),
    pytest.param([header(a=[["x", F4]]), b""], {}, id="spec-two-fields"),
    pytest.param([header(a=["x"]), b""], {}, id="spec-not-list"),
    pytest.param([header(a=[[1, F4, [1]]]), b"\0" * 4], {}, id="name-not-str"),
    pytest.param(one_array([1], "|O", 8), {}, id="dtype-object"),
    pytest.param(one_array([1], "<U4", 16), {}, id="dtype-unicode"),
    pytest.param(one_array([1], "|V8", 8), {}, id="dtype-void"),
    pytest.param(one_array([1], "V8", 8), {}, id="dtype-void-unprefixed"),
    pytest.param(one_array([1], ">f4", 4), {}, id="dtype-big-endian"),
    pytest.param(one_array([1], "<M8[ns]", 8), {}, id="dtype-datetime"),
    pytest.param(one_array([1], "<c8", 8), {}, id="dtype-complex"),
    pytest.param(one_array([1], "float32", 4), {}, id="dtype-name-not-str-code"),
    pytest.param(one_array([1], 4, 4), {}, id="dtype-not-str"),
    pytest.param(one_array([-1]), {}, id="dim-negative"),
    pytest.param(one_array([2, -2]), {}, id="dims-negative-product-positive"),
    pytest.param(one_array([1.0], nbytes=4), {}, id="dim-float"),
    pytest.param(one_array([True], nbytes=4), {}, id="dim-bool"),
    pytest.param(one_array(["1"], nbytes=4), {}, id="dim-str"),
    pytest.param(one_array([None], nbytes=4), {}, id="dim-nil"),
    pytest.param(one_array(4, nbytes=16), {}, id="shape-int"),
    pytest.param(one_array(None, nbytes=4), {}, id="shape-nil"),
    pytest.param(one_array([1] * (wire.MAX_DIMS + 1), nbytes=4), {}, id="too-many-dims"),
    pytest.param(one_array([2, 3], nbytes=20), {}, id="buffer-too-short"),
    pytest.param(one_array([2, 3], nbytes=28), {}, id="buffer-too-long"),
    pytest.param(one_array([], nbytes=0), {}, id="scalar-without-bytes"),
    pytest.param(one_array([0, 3], nbytes=4), {}, id="empty-shape-with-bytes"),
    pytest.param(one_array([3], "<f8", 12), {}, id="buffer-for-other-itemsize"),
    pytest.param([header(a=[["x", F4, [1]], ["x", F4, [1]]]), b"\0" * 4, b"\0" * 4], {},
                 id="duplicate-names"),
    pytest.param(one_array([1000], nbytes=4000), {"max_bytes": 100}, id="over-max-bytes"),
    pytest.param([header(a=[["x", F4, [20]], ["y", F4, [20]]]), b"\0" * 80, b"\0" * 80],
                 {"max_bytes": 100}, id="total-over-max-bytes"),
    pytest.param(one_array([1 << 40, 0], "|u1"), {}, id="dim-over-max-bytes"),
    pytest.param(one_array([1 << 30, 1 << 30, 4], "|u1"), {}, id="huge-shape-no-frame"),
    pytest.param(one_array([1 << 30, 1 << 30, 16], "|u1"), {},
                 id="shape-product-wraps-to-zero"),
    pytest.param(one_array([1 << 30, 1 << 30, 16, 1, 1], "<u2"), {},
                 id="shape-product-wraps-itemsize-2"),
]


@pytest.mark.parametrize(("frames", "kwargs"), BAD_MESSAGES)
def test_decode_rejects_with_wire_error(frames: list, kwargs: dict) -> None:
    with pytest.raises(WireError):
        decode(frames, **kwargs)


def test_decode_accepts_what_the_bad_cases_are_variations_of() -> None:
    """The controls: the unmodified header and a well-formed array spec do decode."""
    assert decode([header()]).kind == "samples"
    assert decode([header()], expected=frozenset({"samples"})).arrays == {}
    message = decode(one_array([2, 3], nbytes=24), max_bytes=24)
    assert message.arrays["x"].shape == (2, 3)
    assert message.arrays["x"].dtype == np.float32
    assert decode(one_array([0, 3], nbytes=0)).arrays["x"].shape == (0, 3)
    assert decode(one_array([], nbytes=4)).arrays["x"].shape == ()


# ---------------------------------------------------------------- receivers drop and count

def test_receive_counts_malformed_messages_and_keeps_going(push_pull, caplog) -> None:
    push, pull = push_pull
    rejects = streams.RejectCounter()
    expected = frozenset({"samples"})
    good = sample_array("<i4", (3, 2))
    with caplog.at_level(logging.WARNING, logger="srl_jax.wire.streams"):
        push.send_multipart([b"\xc1 garbage"])
        push.send_multipart([b"\xc1 more garbage", b"\0" * 8])
        streams.send(push, "params", {"version": 1}, {})  # a kind this receiver does not take
        push.send_multipart([header(a=[["x", F4, [2]]]), b"\0" * 3])
        streams.send(push, "samples", {"seq": 9}, {"x": good})
        received = None
        while received is None:  # the four malformed ones are counted and skipped
            received = receive_one(pull, expected, rejects)
    assert received is not None
    _, message = received
    assert message.meta == {"seq": 9}
    check_same(message.arrays["x"], good)
    assert rejects.count == 4
    assert streams.receive(pull, expected, rejects) is None  # nothing waiting: not a reject
    assert rejects.count == 4
    warnings = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 3, "the two non-msgpack headers share a reason: logged once"


@pytest.mark.parametrize("frames", [
    pytest.param([header(k=["samples"])], id="unhashable-kind"),
    pytest.param(one_array([1 << 30, 1 << 30, 16], "|u1"), id="shape-product-wraps"),
])
def test_receive_never_raises_on_malformed_input(push_pull, frames: list) -> None:
    push, pull = push_pull
    rejects = streams.RejectCounter()
    push.send_multipart(frames)
    assert receive_one(pull, frozenset({"samples"}), rejects) is None
    assert rejects.count == 1


def test_router_receive_counts_message_without_header() -> None:
    context = zmq.Context.instance()
    router = streams.make_socket(context, zmq.ROUTER)
    port = router.bind_to_random_port(f"tcp://{streams.LOOPBACK}")
    dealer = streams.make_socket(context, zmq.DEALER)
    try:
        dealer.connect(f"tcp://{streams.LOOPBACK}:{port}")
        rejects = streams.RejectCounter()
        expected = frozenset({"infer_request"})
        dealer.send(b"\x93\x01\x02")  # a msgpack list, not a map
        assert receive_one(router, expected, rejects, envelope=1) is None
        assert rejects.count == 1
        obs = sample_array("<f4", (5, 4))
        streams.send(dealer, "infer_request", {"split": 1, "seq": 2}, {"obs": obs})
        received = receive_one(router, expected, rejects, envelope=1)
        assert received is not None
        routing, message = received
        assert len(routing) == 1 and routing[0]
        check_same(message.arrays["obs"], obs)
        streams.send(router, "infer_reply", {"seq": 2}, {"value": obs[:, 0]}, routing=routing)
        assert dealer.poll(TIMEOUT_MS)
        reply = streams.receive(dealer, frozenset({"infer_reply"}), rejects)
        assert reply is not None and reply[1].meta == {"seq": 2}
        assert rejects.count == 1
    finally:
        dealer.close()
        router.close()


def test_a_worker_drops_a_peer_that_sends_a_frame_above_the_limit(tmp_path) -> None:
    """`runtime.max_message_mb`: ZMQ refuses the frame before allocating it."""
    config = make_config(["runtime.max_message_mb=0.001"])  # 1,048 bytes
    worker = Worker(config, 0, tmp_path, FileNameService(tmp_path / "names"))
    try:
        pull = make_socket(worker.zmq, zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        pushes = [make_socket(zmq.Context(), zmq.PUSH) for _ in range(2)]
        for push in pushes:
            push.connect(f"tcp://127.0.0.1:{port}")
        pushes[0].send_multipart([b"a" * 1000, b"b" * 1000])  # each frame below the limit
        pushes[0].send(b"x" * 4000)
        pushes[1].send(b"ok")
        received = []
        while pull.poll(500):
            received.append([len(frame) for frame in pull.recv_multipart()])
        assert sorted(received) == [[2], [1000, 1000]], "the oversized frame never arrives"
        for socket in (pull, *pushes):
            socket.close()
    finally:
        worker.zmq.setsockopt(zmq.MAXMSGSIZE, -1)  # the shared context's default again
