"""Where one policy's chunks go from an actor: its end of the samples or inserts stream
(`Worker.connect`: ZeroMQ, or shared-memory slots where the learner or the replay servers
share its host). A full stream drops the chunk or blocks, heartbeating, as
`actors.send_policy` says: full is the socket's high-water mark, or every slot of the
ring still waiting to be copied out (a slot is never overwritten while its chunk waits)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from srl_jax.wire.stream_ends import Connecter

POLL_MS = 100
SEND_WAIT_LOG_S = 5.0

log = logging.getLogger(__name__)


class ChunkSender:
    """Sends one policy's chunks, counting those sent and dropped."""

    def __init__(self, end: Connecter, destination: str, drop: bool,
                 keep_alive: Callable[[], bool]) -> None:
        """`destination`: what a blocked send waits on, for logs and heartbeats;
        `keep_alive`: heartbeats, and says whether to keep waiting."""
        self.end = end
        self.destination = destination
        self.drop = drop
        self.keep_alive = keep_alive
        self.sent = 0
        self.dropped = 0
        self.blocked_since: float | None = None
        """Wall time since which a send waits on a full stream (None: it does not)."""

    def send(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        if self.end.send(meta, arrays):
            self.sent += 1
        elif self.drop:
            self.dropped += 1
        else:
            self._send_blocking(meta, arrays)

    def _send_blocking(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        next_log = start + SEND_WAIT_LOG_S
        self.blocked_since = time.time()
        try:
            while self.keep_alive():
                if self.end.wait_writable(POLL_MS) and self.end.send(meta, arrays):
                    self.sent += 1
                    return
                if time.perf_counter() > next_log:
                    log.info("waiting %.0fs on the %s: sample stream full",
                             time.perf_counter() - start, self.destination)
                    next_log += SEND_WAIT_LOG_S
        finally:
            self.blocked_since = None

    def close(self) -> None:
        self.end.close()
