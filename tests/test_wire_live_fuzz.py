"""Live wire fuzzing: malformed messages against real sockets and a real run.

The live test starts a run and sends a few thousand malformed messages (3,774
with seed 8) to every endpoint the run advertises in `<run>/names/`, with every
socket type that can connect, and raw TCP below ZMQ; no process may die or
restart, memory stays flat, and the workers count every message they drop in
`system/wire_rejected`. Which endpoint is which stream, and what each binder
takes, comes from the stream table. The decoder's own properties:
tests/test_wire_decoder_properties.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket as pysocket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from srl_jax.dataflow.stream_table import INFERENCE, PARAMS, SAMPLES, STATS, Stream, stream_of
from srl_jax.runtime.memory import resident_mib
from srl_jax.runtime.run_dir import read_status
from srl_jax.runtime.shm_attach import SCHEME
from srl_jax.wire import codec as wire
from srl_jax.wire import streams
from srl_jax.wire.codec import WireError, decode, encode
from srl_jax.wire.shm.bell import MAGIC, RECORD
from tests.conftest import (
    Processes,
    all_running,
    interrupt,
    last_row,
    read_metrics,
    wait_for,
)
from tests.wire_junk import BAD_DTYPES, DTYPES, HUGE, KINDS, header_with_raw_meta, nested


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

FUZZ_BUDGET_S = 60.0
"""How long the fuzzing may send (it took about 4 s on 2 loaded cores): a guard against a
hang, not a limit it meets. The run has none: it ends on Ctrl-C once the drops are counted."""
LIVE_MIN_SENT = 2000
SEND_TIMEOUT_MS = 3000
RSS_JUMP_MB = 50.0
def read_endpoints(run_dir: Path) -> dict[str, str]:
    """Every endpoint in the run's FileNameService directory, by key."""
    return {path.name.replace("__", "/"): path.read_text().strip()
            for path in (run_dir / "names").iterdir() if ".tmp" not in path.name}


def ring_junk(bell: Path, fuzzer: LiveFuzzer, count: int) -> int:
    """Write `count` pieces of junk into a doorbell FIFO: random bytes of random lengths,
    and well-formed records naming random processes, slots and stamps; how many went in."""
    rng, written = fuzzer.rng, 0
    fd = os.open(bell, os.O_WRONLY | os.O_NONBLOCK)
    try:
        for _ in range(count):
            junk = fuzzer._bytes(rng.randint(1, 64)) if rng.random() < 0.5 else RECORD.pack(
                rng.randint(0, 2**32 - 1), rng.randint(0, 2**16 - 1), MAGIC,
                rng.randint(1, 2**64 - 1))
            with contextlib.suppress(BlockingIOError):
                os.write(fd, junk)
                written += 1
    finally:
        os.close(fd)
    return written


def rss_mb(pid: int) -> float:
    rss = resident_mib(pid)
    assert rss is not None, f"no VmRSS for pid {pid}"
    return rss


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

    def _wrong_obs(self, stream: Stream) -> np.ndarray | None:
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
        return np.zeros((*self.CHUNK_OBS[:2], 5) if stream is SAMPLES else (n, 4, 1),
                        np.float32)

    def _valid_kinds_wrong_shapes(self, stream: Stream) -> list[Any]:
        kind = min(stream.binder_receives or STATS.binder_receives)  # a PUB receives none
        arrays: dict[str, np.ndarray] = {}
        if stream is SAMPLES:
            arrays = {name: np.zeros((32, 8), np.float32) for name in (
                "actions", "logp", "rewards", "trunc_values", "versions")}
            arrays["values"] = np.zeros((33, 8), np.float32)
            arrays["terminated"] = arrays["truncated"] = np.zeros((32, 8), bool)
        obs = self._wrong_obs(stream)
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

    def _mutated(self, stream: Stream) -> list[Any]:
        frames = [bytes(f) for f in self._valid_kinds_wrong_shapes(stream)]
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

    def _other_kind(self, stream: Stream) -> list[Any]:
        kind = self.rng.choice([k for k in KINDS if k not in stream.binder_receives])
        return encode(kind, {"version": 1, "worker": "fuzz"}, {"x": self._array()})

    def _special(self) -> list[Any]:
        choice = self.rng.randrange(3)
        if choice == 0:
            return [b"\0" * (wire.MAX_HEADER_BYTES + 1)]
        if choice == 1:
            return [header_with_raw_meta("samples", nested(self.rng.choice([2000, 60000])), [])]
        return [msgpack.packb({"k": "stats", "v": 1, "m": {"pad": b"\0" * (1 << 16)}, "a": []})]

    def message(self, stream: Stream) -> list[Any]:
        pick = self.rng.randrange(100)
        if pick < 15:
            return [self._bytes(self.rng.randint(0, 200)) for _ in range(self.rng.randint(1, 4))]
        if pick < 30:
            return self._bad_header()
        if pick < 50:
            return self._bad_arrays()
        if pick < 70:
            return self._mutated(stream)
        if pick < 80:
            return self._other_kind(stream)
        if pick < 97:
            return self._valid_kinds_wrong_shapes(stream)
        return self._special()

    def rejected(self, stream: Stream, frames: list[Any]) -> bool:
        """Whether the binder of `stream` must drop (and count) this message."""
        try:
            message = decode(frames, expected=stream.binder_receives)
        except WireError:
            return True
        if stream not in (INFERENCE, SAMPLES):
            return False  # the controller drops what it cannot use without counting it
        obs = message.arrays.get("obs")
        if obs is None or obs.dtype != np.float32:
            return True
        if stream is SAMPLES:
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

    def counted_messages(self, stream: Stream, count: int) -> list[list[Any]]:
        """`count` messages the worker must reject (others are drawn again)."""
        out: list[list[Any]] = []
        while len(out) < count:
            frames = self.message(stream)
            if frames and self.rejected(stream, frames):
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


@pytest.mark.slow
def test_live_run_survives_thousands_of_malformed_messages(processes: Processes,
                                                           tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = processes.start(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir", str(run_dir),
         "--quiet", "--set", "stop.target_return=null", "--set", "stop.wall_time_s=600",
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
    # The same-host streams' doorbells (srl_jax/wire/shm/): FIFOs, fuzzed below.
    bells = {key: Path(endpoints.pop(key).removeprefix(SCHEME))
             for key in [k for k, endpoint in endpoints.items() if endpoint.startswith(SCHEME)]}
    assert sorted(stream_of(key).name for key in bells) == ["inference", "samples"], bells
    roles = {key: stream_of(key) for key in endpoints}
    assert sorted(stream.name for stream in roles.values()) == [
        "inference", "params", "samples", "stats"], endpoints
    params_key = next(key for key, stream in roles.items() if stream is PARAMS)
    fuzz_start = time.time() - before["started"]
    deadline = time.time() + FUZZ_BUDGET_S
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
        subscriber = connect(PARAMS.connect_type, endpoints[params_key], SUBSCRIBE=b"")
        for key, endpoint in sorted(endpoints.items(), key=lambda item: roles[item[0]] is STATS):
            stream = roles[key]
            if stream is INFERENCE:  # a ROUTER: DEALERs (one with its own id) and REQs
                for options in ({}, {"ROUTING_ID": b"fuzz"}):
                    dealer = connect(zmq.DEALER, endpoint, **options)
                    n = send_all(dealer, fuzzer.counted_messages(stream, 700), deadline)
                    counted += n
                    sent[f"{key} DEALER"] = sent.get(f"{key} DEALER", 0) + n
                req = connect(zmq.REQ, endpoint, REQ_RELAXED=1)
                n = 0
                for frames in fuzzer.counted_messages(stream, 200):  # arrives after an empty frame
                    if time.time() > deadline:
                        break
                    req.send_multipart(frames, copy=False)
                    n += 1
                counted += n
                sent[f"{key} REQ"] = n
            elif stream is SAMPLES:  # a PULL: PUSH
                push = connect(zmq.PUSH, endpoint)
                n = send_all(push, fuzzer.counted_messages(stream, 1400), deadline)
                counted += n
                sent[f"{key} PUSH"] = n
            elif stream is STATS:  # a PULL: PUSH (last: it judges the others)
                push = connect(zmq.PUSH, endpoint)
                messages = [fuzzer.message(stream) for _ in range(500)]
                to_controller += sum(fuzzer.rejected(stream, m) for m in messages)
                messages += [encode("stats", {"worker": worker, "pid": 1, "counters": {}})
                             for worker in ([1], {"a": 1}, None, 3.5, b"actor-0", "actor-9")]
                forged = fuzzer.forged_heartbeats(before["workers"])
                to_controller += len(forged)
                sent[f"{key} PUSH"] = send_all(push, messages + forged, deadline)
            elif stream is PARAMS:  # a PUB only sends: a SUB listens (above), and an
                xsub = connect(zmq.XSUB, endpoint)  # XSUB sends it junk subscriptions
                junk = [b"\x01" + fuzzer._bytes(fuzzer.rng.randint(0, 32)) for _ in range(100)]
                junk += [fuzzer._bytes(fuzzer.rng.randint(0, 32)) for _ in range(100)]
                sent[f"{key} XSUB"] = send_all(xsub, [[j] for j in junk], deadline)
            # Incompatible types: ZMTP refuses them in the handshake, nothing is delivered.
            wrong = connect(zmq.PAIR if stream is PARAMS else zmq.PUB, endpoint)
            with contextlib.suppress(zmq.Again):
                for _ in range(20):
                    wrong.send_multipart(fuzzer.message(stream), flags=zmq.NOBLOCK)
            socket_type = zmq.SocketType(stream.connect_type).name.encode()
            payloads = raw_payloads(socket_type, fuzzer.rng)
            if stream is not PARAMS:  # a PUB reads subscriptions only
                delivered = delivered_by_raw(payloads, stream.bind_type)
                if stream is STATS:
                    to_controller += delivered
                else:
                    counted += delivered
            send_raw(endpoint, payloads)
            sent[f"{key} raw tcp"] = len(payloads)
        for key, bell in bells.items():  # junk, cut records and records of no message
            sent[f"{key} doorbell"] = ring_junk(bell, fuzzer, 300)
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
                 or process.poll() is not None, 60, f"{lower} rejects counted")
        assert process.poll() is None, tail(tmp_path / "launch.log")
        assert subscriber.poll(5000), "no parameters published after the fuzzing"
        assert decode(subscriber.recv_multipart(), PARAMS.connecter_receives).meta["version"] >= 1
        wait_for(lambda: last_row(run_dir).get("inference/shm_stale", 0) > 0, 30,
                 "the doorbell junk dropped and counted by the server")
        rss_after = {name: rss_mb(pid) for name, pid in pids.items()}
    finally:
        for sock in sockets:
            sock.close()
        context.term()

    interrupt(process, tmp_path / "launch.log")
    final = read_status(run_dir)
    assert final["state"] == "interrupted", final
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
