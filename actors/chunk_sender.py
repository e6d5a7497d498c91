"""Where one policy's chunks go from an actor: a ZMQ socket (to the learner or the
replay servers on other hosts), or the actor's ring of shared-memory slots where they
share its host (srl_jax/wire/shm/). A full stream drops the chunk or blocks,
heartbeating, as `actors.send_policy` says: full is the socket's high-water mark, or
every slot of the ring still waiting to be copied out (a slot is never overwritten while
its chunk waits). Where the binders could not be rung through shared memory for a
heartbeat timeout, the stream is handed to ZeroMQ for good (logged once)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import zmq

from srl_jax.wire.shm.channels import Outbox
from srl_jax.wire.streams import NOBLOCK, send

POLL_MS = 100
SLOT_WAIT_S = 0.002
"""How often a blocked send looks for a free slot (nothing rings when one frees)."""
SEND_WAIT_LOG_S = 5.0

log = logging.getLogger(__name__)


class ChunkSender:
    """Sends one policy's chunks, counting those sent and dropped."""

    def __init__(self, socket: zmq.Socket, outbox: Outbox | None, destination: str,
                 drop: bool, keep_alive: Callable[[], bool]) -> None:
        """`destination`: what a blocked send waits on, for logs and heartbeats;
        `keep_alive`: heartbeats, and says whether to keep waiting."""
        self.socket = socket
        self.outbox = outbox
        self.destination = destination
        self.drop = drop
        self.keep_alive = keep_alive
        self.sent = 0
        self.dropped = 0
        self.retired: Outbox | None = None
        """The shared-memory slots handed to ZeroMQ, kept for their counters."""
        self.blocked_since: float | None = None
        """Wall time since which a send waits on a full stream (None: it does not)."""

    def send(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        if self._try(meta, arrays):
            self.sent += 1
        elif self.drop:
            self.dropped += 1
        else:
            self._send_blocking(meta, arrays)

    def _try(self, meta: dict, arrays: dict[str, np.ndarray]) -> bool:
        if self.outbox is not None and self.outbox.unreachable:
            log.warning("the %s could not be rung through shared memory for %.0fs: ZeroMQ "
                        "carries its chunks from now on", self.destination,
                        self.outbox.handoff_after_s)
            self.retired, self.outbox = self.outbox, None
        if self.outbox is not None:
            slot = self.outbox.free_slot()
            return slot is not None and self.outbox.send(slot, meta, arrays)
        try:
            send(self.socket, "samples", meta, arrays, flags=NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _send_blocking(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        next_log = start + SEND_WAIT_LOG_S
        self.blocked_since = time.time()
        try:
            while self.keep_alive():
                if self.outbox is not None:
                    time.sleep(SLOT_WAIT_S)
                    ready = True
                else:
                    ready = bool(self.socket.poll(POLL_MS, zmq.POLLOUT))
                if ready and self._try(meta, arrays):
                    self.sent += 1
                    return
                if time.perf_counter() > next_log:
                    log.info("waiting %.0fs on the %s: sample stream full",
                             time.perf_counter() - start, self.destination)
                    next_log += SEND_WAIT_LOG_S
        finally:
            self.blocked_since = None

    def close(self) -> None:
        for outbox in (self.outbox, self.retired):
            if outbox is not None:
                outbox.close()
        self.socket.close()
