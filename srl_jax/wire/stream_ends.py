"""A worker's end of a stream, whichever transport carries it (`Worker.connect`, `Worker.bind`).

A same-host stream (`Stream.same_host`: inference, samples, inserts) goes through shared
memory between workers of one host (srl_jax/wire/shm/) and through ZeroMQ otherwise; its
ends hide which. A `Connecter` (the actor's) sends through its slots where every binder
shares its host, else on its socket, and hands the stream to the socket for good where its
binders could not be rung for a heartbeat timeout. A `Binder` (an inference server, a
learner's sample intake, a replay server) takes messages from its doorbell and its socket
in turn, and answers a request along the route it came by. Which transport an end gets is
srl_jax/runtime/shm_attach.py's choice; the ends only carry it out.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any, cast

import numpy as np
import zmq

from srl_jax.wire.codec import Message
from srl_jax.wire.shm.channels import Inbox, Outbox, Route
from srl_jax.wire.streams import NOBLOCK, RejectCounter, receive, send

EVENTS, POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
"""Plain ints: pyzmq's flag enums cost a Python call per `&`."""
SLOT_WAIT_S = 0.002
"""How often a send blocked on a full ring of slots looks for a free one (nothing rings
when one frees)."""

Origin = list[bytes] | Route
"""Where a binder's message came from: a ROUTER's routing frames (none on a PULL socket),
or its slot in shared memory."""


class Connecter:
    """A connecter's end: its socket and, where every binder shares its host, its slots
    (`outbox`). A request stream's slots are REQUEST_SLOTS per split (`split_slots`), a
    request sent again going to one no binder is answering; a chunk stream's are a ring."""

    COUNTERS = ("shm_mib", "shm_reclaimed", "shm_rerung", "shm_handoffs")
    """Its heartbeat counters (srl_jax/dataflow/metrics_table.py, the actor's)."""

    def __init__(self, socket: zmq.Socket, kind: str, receives: frozenset[str],
                 rejects: RejectCounter, outbox: Outbox | None = None, split_slots: int = 0,
                 destination: str = "binders", log: logging.Logger | None = None) -> None:
        """`kind`: the message kind it sends; `receives`: the kinds its binders answer
        with; `split_slots`: slots per split of a request stream (0: a chunk ring);
        `destination`: who its binders are, for the hand-off's log line."""
        self.socket = socket
        self.kind = kind
        self.receives = receives
        self.rejects = rejects
        self.outbox = outbox
        self.retired: Outbox | None = None
        """The slots handed to ZeroMQ (`_hand_off`), kept for their counters."""
        self.destination = destination
        self.log = log or logging.getLogger(__name__)
        self._split_slots = None if outbox is None or not split_slots else [
            range(first, first + split_slots) for first in range(0, outbox.slots, split_slots)]
        """Each split's request slots (None: a ring, any free slot)."""
        self._replies = None if outbox is None else outbox.replies
        """The reply doorbell of a request stream's slots (None: replies come on the socket)."""
        self._polled: Any = socket if self._replies is None else self._replies.fileno()
        """What a poll's events name for its replies: the socket, or the reply doorbell."""
        self._poller: zmq.Poller | None = None

    def register(self, poller: zmq.Poller) -> None:
        """Watch for replies in `poller` (its socket or its reply doorbell: `ready`)."""
        self._poller = poller
        poller.register(self.socket if self._replies is None else self._replies, zmq.POLLIN)

    @property
    def pending(self) -> bool:
        """Replies already read off the doorbell wait: poll without waiting."""
        return self._replies is not None and self._replies.pending

    def ready(self, events: dict[Any, int]) -> bool:
        """Whether a reply may wait, after a poll that gave `events`."""
        return self._polled in events or self.pending

    def send(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], split: int = 0) -> bool:
        """Send without blocking; False where the stream has no room now (every slot still
        holds a message, the socket's high-water mark, no binder connected). `split`: the
        split a request is for."""
        outbox = self.outbox
        if outbox is not None and outbox.unreachable:
            self._hand_off(outbox)
            outbox = None
        if outbox is None:
            try:
                send(self.socket, self.kind, meta, arrays, flags=NOBLOCK)
                return True
            except zmq.Again:
                return False
        slot = outbox.free_slot() if self._split_slots is None else \
            outbox.open_slot(self._split_slots[split])
        return slot is not None and outbox.send(slot, meta, arrays)

    def wait_writable(self, timeout_ms: int) -> bool:
        """Wait (up to `timeout_ms` on the socket, a moment on slots) for room to send."""
        if self.outbox is None:
            return bool(self.socket.poll(timeout_ms, zmq.POLLOUT))
        time.sleep(SLOT_WAIT_S)
        return True

    def receive(self) -> Message | None:
        """The next reply, or None if none is waiting."""
        if self.outbox is not None:
            return self.outbox.receive(self.rejects)
        received = receive(self.socket, self.receives, self.rejects)
        return None if received is None else received[1]

    def _hand_off(self, outbox: Outbox) -> None:
        """No binder could be rung for a heartbeat timeout: ZeroMQ carries the stream from
        now on (logged once, counted in `shm_handoffs`)."""
        self.log.warning("the %s could not be rung through shared memory for %.0fs: ZeroMQ "
                         "carries the stream from now on", self.destination,
                         outbox.handoff_after_s)
        if self._poller is not None and self._replies is not None:
            self._poller.unregister(self._replies)
            self._poller.register(self.socket, zmq.POLLIN)
        self.retired, self.outbox, self._replies, self._polled = outbox, None, None, self.socket

    def counters(self) -> dict[str, float]:
        slots = [outbox for outbox in (self.outbox, self.retired) if outbox is not None]
        return {"shm_mib": self.outbox.nbytes / 2**20 if self.outbox is not None else 0.0,
                "shm_reclaimed": sum(outbox.reclaimed for outbox in slots),
                "shm_rerung": sum(outbox.rerung for outbox in slots),
                "shm_handoffs": int(self.retired is not None)}

    def close(self) -> None:
        for outbox in (self.outbox, self.retired):
            if outbox is not None:
                outbox.close()
        self.socket.close()


class Binder:
    """A binder's end: its socket and, where connecters share its host, its doorbell
    (`inbox`). It takes messages from one until that has none, then from the other;
    `rotate`, once a batch, moves on to the next, so that a busy one never starves the
    other."""

    COUNTERS = ("shm_received", "shm_stale", "shm_mapped_mib")
    """Its heartbeat counters (srl_jax/dataflow/metrics_table.py, `shm_binder`)."""

    def __init__(self, socket: zmq.Socket, receives: frozenset[str], rejects: RejectCounter,
                 inbox: Inbox | None = None, envelope: int = 0, reply_kind: str = "",
                 copy: bool = False) -> None:
        """`receives`: the kinds connecters send; `envelope`: routing frames its socket
        prepends (a ROUTER's 1); `reply_kind`: what it answers a request with; `copy`:
        a message's arrays copied out of its slot, which is given back at once (chunks),
        else they view it until the request is answered (`reply`) or let go (`release`)."""
        self.socket = socket
        self.receives = receives
        self.rejects = rejects
        self.inbox = inbox
        self.envelope = envelope
        self.reply_kind = reply_kind
        self._sources: tuple[Any, ...] = (self._socket,) if inbox is None else \
            (partial(inbox.receive, copy), self._socket_if_ready)
        """Where it takes messages from in turn; each is given the doorbell's `limit`."""
        self._at = 0
        self._bell = None if inbox is None else inbox.fileno()
        self._waiter = zmq.Poller()
        self.register(self._waiter)

    def register(self, poller: zmq.Poller, flags: int = zmq.POLLIN) -> None:
        """Watch its socket and doorbell in `poller` (`flags` 0: stop watching)."""
        poller.register(self.socket, flags)
        if self.inbox is not None:
            poller.register(self.inbox, flags)

    @property
    def pending(self) -> bool:
        """Records already read off the doorbell wait: poll without waiting."""
        return self.inbox is not None and self.inbox.pending

    def ready(self, events: dict[Any, int]) -> bool:
        """Whether a message may wait, after a poll that gave `events`."""
        return self.socket in events or self._bell in events or self.pending

    def wait(self, timeout_ms: int) -> bool:
        """Whether a message waits, after up to `timeout_ms`."""
        return self.pending or bool(self._waiter.poll(timeout_ms))

    def receive(self, limit: int | None = None) -> tuple[Origin, Message] | None:
        """The next well-formed message and where it came from, or None. `limit`: records
        taken off the doorbell at once at most (the rest stay there for an idle peer)."""
        sources = self._sources
        for _ in sources:
            if (received := sources[self._at](limit)) is not None:
                return received
            self._at = (self._at + 1) % len(sources)
        return None

    def rotate(self) -> None:
        self._at = (self._at + 1) % len(self._sources)

    def _socket(self, _: int | None = None) -> tuple[Origin, Message] | None:
        return receive(self.socket, self.receives, self.rejects, envelope=self.envelope)

    def _socket_if_ready(self, _: int | None) -> tuple[Origin, Message] | None:
        """Beside shared memory the socket is mostly empty: its events say so for a fifth
        of what a zmq.Again costs."""
        if not cast(int, self.socket.getsockopt(EVENTS)) & POLLIN:
            return None
        return self._socket()

    def reply(self, origin: Origin, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Answer the request that came from `origin`, along the route it came by."""
        if isinstance(origin, Route):  # only its doorbell gives routes
            cast(Inbox, self.inbox).reply(origin, meta, arrays)
        else:
            send(self.socket, self.reply_kind, meta, arrays, routing=origin)

    def release(self, origin: Origin) -> None:
        """Let a request go unanswered (it was refused): its slot is free again."""
        if isinstance(origin, Route):
            cast(Inbox, self.inbox).release(origin)

    def counters(self) -> dict[str, float]:
        return dict.fromkeys(self.COUNTERS, 0.0) if self.inbox is None else self.inbox.counters()

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()
        self.socket.close()
