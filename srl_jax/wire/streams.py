"""Streams: the few ZMQ socket patterns the dataflow uses, over the wire format.

- inference stream: actors' DEALER -> inference servers' ROUTER (requests are
  spread over all connected servers; replies return to the asking actor);
- sample stream: actors' PUSH -> learner's PULL, bounded by high-water marks;
- parameter stream: learner's PUB -> inference servers' SUB, newest version wins
  (through host agents' relays on a cluster: srl_jax/runtime/hosts/param_relay.py);
- stats stream: every worker's PUSH -> controller's PULL (heartbeats + counters).

Where sockets bind, and CURVE off loopback: srl_jax/wire/transport.py.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import zmq

from srl_jax.wire.codec import Message, WireError, decode, encode

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MAX_LOGGED_REASONS = 64
MAX_SKIPPED = 1024
"""Malformed messages one `receive` call drops before it returns None."""
_REQUEST_IDS = itertools.count(1)


class RejectCounter:
    """Counts malformed messages and logs the first of each reason."""

    def __init__(self) -> None:
        self.count = 0
        self._seen: set[str] = set()

    def reject(self, error: Exception, count: int = 1) -> None:
        """`count` parts of a message (or messages) dropped for `error`."""
        self.count += count
        reason = str(error).split(":")[0]
        if reason not in self._seen and len(self._seen) < MAX_LOGGED_REASONS:
            self._seen.add(reason)
            log.warning("dropped a malformed message (%s); further ones are only counted", error)


NOBLOCK, SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
"""Plain ints: pyzmq's flag enums cost a Python call per `|`, on every frame."""
ZERO_COPY_BYTES = 1 << 16
"""Frames from this size up are sent without a copy (pyzmq's own default threshold)."""


def _recv_frames(socket: zmq.Socket) -> list[zmq.Frame] | None:
    """One multipart message's frames without blocking (None if none is waiting).

    pyzmq's `recv_multipart` asks the socket option RCVMORE after every frame;
    each frame already says whether more follow.
    """
    try:
        frame = socket.recv(NOBLOCK, copy=False)
    except zmq.Again:
        return None
    frames = [frame]
    while frame.more:
        frame = socket.recv(0, copy=False)
        frames.append(frame)
    return frames


def receive(socket: zmq.Socket, expected: frozenset[str], rejects: RejectCounter,
            envelope: int = 0, max_bytes: int = 1 << 30) -> tuple[list[bytes], Message] | None:
    """Receive one well-formed multipart message without blocking.

    Returns (routing frames, message), or None if no well-formed message was
    waiting. Malformed ones on the way are counted in `rejects` and skipped (at
    most MAX_SKIPPED per call), so that a caller draining with
    `while receive(...) is not None` is not stopped by the first bad message.
    `envelope` is the number of routing frames a ROUTER socket prepends.
    """
    received = _receive_valid(socket, expected, rejects, envelope, max_bytes)
    if received is None:
        return None
    return [frame.bytes for frame in received[0][:envelope]], received[1]


def receive_frames(socket: zmq.Socket, expected: frozenset[str], rejects: RejectCounter,
                   max_bytes: int = 1 << 30) -> tuple[list[zmq.Frame], Message] | None:
    """Like `receive`, with the frames as they came, for a relay that sends them on
    unchanged and without a copy (`send_frames`)."""
    return _receive_valid(socket, expected, rejects, 0, max_bytes)


def _receive_valid(socket: zmq.Socket, expected: frozenset[str], rejects: RejectCounter,
                   envelope: int, max_bytes: int) -> tuple[list[zmq.Frame], Message] | None:
    for _ in range(MAX_SKIPPED):
        frames = _recv_frames(socket)
        if frames is None:
            return None
        if len(frames) <= envelope:
            rejects.reject(WireError("message has no header frame"))
            continue
        try:
            return frames, decode(frames[envelope:], expected=expected, max_bytes=max_bytes)
        except WireError as error:
            rejects.reject(error)
    return None


def send_frames(socket: zmq.Socket, frames: list[zmq.Frame], flags: int = 0) -> None:
    """Send frames received whole (`receive_frames`) again, sharing their buffers."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        socket.send(frame, flags if i == last else flags | SNDMORE, copy=False)


def send(socket: zmq.Socket, kind: str, meta: dict[str, Any] | None = None,
         arrays: dict[str, Any] | None = None, routing: list[bytes] | None = None,
         flags: int = 0) -> None:
    """Send one message, prefixed with `routing` frames for ROUTER sockets.

    Frame by frame rather than by `send_multipart`, which costs about three
    times as much per small message; ZMQ queues a multipart message whole or
    not at all, so a full queue still raises `zmq.Again` before the first frame.
    Frames under ZERO_COPY_BYTES are copied (a zero-copy frame costs more to set
    up than a small copy), larger ones are sent without a copy.
    """
    frames = [*routing, *encode(kind, meta, arrays)] if routing else encode(kind, meta, arrays)
    flags = int(flags)
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        socket.send(frame, flags if i == last else flags | SNDMORE,
                    copy=not isinstance(frame, memoryview) or frame.nbytes < ZERO_COPY_BYTES)


def ask(socket: zmq.Socket, kind: str, meta: dict[str, Any], expected: frozenset[str],
        rejects: RejectCounter, timeout_s: float) -> Message | None:
    """Send a request on a DEALER with a fresh `id` in its meta, and wait up to `timeout_s`
    for the reply that carries the id back (None: none came); replies to requests given
    up on earlier are skipped, so a late answer is never taken for the next one's."""
    request_id = next(_REQUEST_IDS)
    send(socket, kind, {**meta, "id": request_id})
    deadline = time.monotonic() + timeout_s
    while socket.poll(int(max(deadline - time.monotonic(), 0.0) * 1000)):
        received = receive(socket, expected, rejects)
        if received is not None and received[1].meta.get("id") == request_id:
            return received[1]
    return None


def limit_message_size(context: zmq.Context, max_mb: float) -> None:
    """Sockets `context` makes from now on drop a peer that sends a frame above `max_mb`
    (ZMQ checks the declared size before it allocates)."""
    context.setsockopt(zmq.MAXMSGSIZE, int(max_mb * 2**20))


def make_socket(context: zmq.Context, kind: int | None, hwm: int | None = None,
                kernel_buffer: int | None = None) -> zmq.Socket:
    """A socket that does not linger on close, with optional send/receive bounds: `hwm`
    messages queued in ZMQ, `kernel_buffer` bytes in the kernel (`Stream.kernel_buffer`).
    `kind`: a stream's `bind_type` or `connect_type`, None for a stream that is no socket."""
    if kind is None:
        raise ValueError("a stream that is no ZMQ socket has no socket to make")
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    if hwm is not None:
        socket.setsockopt(zmq.SNDHWM, hwm)
        socket.setsockopt(zmq.RCVHWM, hwm)
    if kernel_buffer is not None:
        socket.setsockopt(zmq.SNDBUF, kernel_buffer)
        socket.setsockopt(zmq.RCVBUF, kernel_buffer)
    return socket
