"""The learner's intake from replay (an `Intake`, learners/workers/intake.py): sampled
batches from its policy's replay servers.

A learner process asks every replay server for parts of `rows` transitions
(`sample_request`, at most `INFLIGHT` outstanding each) and builds a batch from
any `parts` parts that came back, so that while one server is dead or refilling,
the others fill its share. Each reply is checked against the sampled-batch layout
(`srl_jax.core.replay_spec`); anything else is counted and dropped. After the update,
`trained` returns each row's new priority to the server it came from.

A server that holds a request (its rate limiter waits) says so every second; one
that says nothing for `SILENCE_S` while asked is presumed gone, and asked again
(its restarted successor registers anew and the socket follows it).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import zmq

from srl_jax.core.chunk_spec import Layout, chunk_error
from srl_jax.core.stream_table import REPLAY
from srl_jax.core.streams import RejectCounter, receive, send

INFLIGHT = 2
"""Sample requests outstanding per replay server."""
SILENCE_S = 5.0
"""A server asked but silent this long is presumed gone; its requests are sent again."""


@dataclass
class _Server:
    socket: zmq.Socket
    key: str
    inflight: dict[int, float] = field(default_factory=dict)
    """seq -> when it was sent."""
    last_heard: float = 0.0
    waiting: str = ""
    """Why it holds our requests, as it last said ('' once it answers)."""


class Part(NamedTuple):
    server: int
    arrays: dict[str, np.ndarray]


class ReplayIntake:
    """Asks, receives, checks and assembles sampled batches; sends back priorities."""

    kept = ("slots", "generations", "shards")
    """Where each row came from: its new priority goes back there (never put on the mesh)."""

    def __init__(self, sockets: list[zmq.Socket], keys: list[str], rows: int, window: int,
                 layout: Layout, rejects: RejectCounter, process_index: int) -> None:
        """`rows` per part, one part per server in a batch; `layout`: one part's arrays;
        `process_index`: this learner process's place in a multi-process batch."""
        now = time.monotonic()
        self.servers = [_Server(s, k, last_heard=now) for s, k in zip(sockets, keys, strict=True)]
        self.rows, self.window, self.layout = rows, window, layout
        self.process_index = process_index
        self.rejects = rejects
        self.ready: deque[Part] = deque()
        self.poller = zmq.Poller()
        for server in self.servers:
            self.poller.register(server.socket, zmq.POLLIN)
        self._seq = 0
        self.frames_consumed = 0
        """Transitions trained on (the learner's samples)."""
        self.requests = 0
        self.timeouts = 0
        self.priorities_sent = 0
        self.priorities_dropped = 0
        self.recent_returns: deque[float] = deque()
        """Episode returns never reach a replay learner (the evaluator's rank it)."""

    @property
    def parts(self) -> int:
        return len(self.servers)

    @property
    def queued(self) -> int:
        """Parts received and not yet trained on."""
        return len(self.ready)

    def pump(self, timeout_ms: int, version: int) -> None:
        """Ask whoever has room, wait up to `timeout_ms` for replies, take them (sampled
        rows have no versions to check)."""
        self._ask()
        if len(self.ready) >= self.parts:
            timeout_ms = 0
        for socket, _ in self.poller.poll(timeout_ms):
            index = next(i for i, s in enumerate(self.servers) if s.socket is socket)
            while (received := receive(socket, REPLAY.connecter_receives,
                                       self.rejects)) is not None:
                self._take(index, received[1].meta, received[1].arrays)
        self._forget_silent()

    def _ask(self) -> None:
        if len(self.ready) >= 2 * self.parts:  # enough on hand: do not hoard samples
            return
        for server in self.servers:
            while len(server.inflight) < INFLIGHT:
                self._seq += 1
                try:
                    send(server.socket, "sample_request",
                         {"seq": self._seq, "rows": self.rows, "window": self.window},
                         flags=zmq.NOBLOCK)
                except zmq.Again:  # not connected yet: try again next turn
                    break
                if not server.inflight:
                    server.last_heard = time.monotonic()
                server.inflight[self._seq] = time.monotonic()
                self.requests += 1

    def _take(self, index: int, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        server = self.servers[index]
        seq = meta.get("seq")
        if type(seq) is not int or seq not in server.inflight:
            return  # the answer to a request given up on
        server.last_heard = time.monotonic()
        if not arrays:
            waiting = meta.get("waiting")
            server.waiting = waiting if isinstance(waiting, str) else "waiting"
            return
        del server.inflight[seq]
        error = chunk_error(arrays, self.layout)
        if error is not None:
            self.rejects.reject(ValueError(error.replace("chunk", "sampled batch")))
            return
        server.waiting = ""
        self.ready.append(Part(index, arrays))

    def _forget_silent(self) -> None:
        now = time.monotonic()
        for server in self.servers:
            if server.inflight and now - server.last_heard > SILENCE_S:
                server.inflight.clear()
                server.waiting = "silent: asked again"
                self.timeouts += 1

    def take_batch(self, version: int) -> dict[str, np.ndarray] | None:
        """A batch of `parts` parts (from any servers), or None while fewer are ready;
        its `shards` array says which server each row came from."""
        if len(self.ready) < self.parts:
            return None
        parts = [self.ready.popleft() for _ in range(self.parts)]
        batch = {name: np.concatenate([p.arrays[name] for p in parts])
                 for name in self.layout}
        batch["shards"] = np.repeat([p.server for p in parts], self.rows)
        self.frames_consumed += len(batch["shards"])
        return batch

    def trained(self, kept: dict[str, np.ndarray], per_row: np.ndarray | None) -> None:
        """Each row's new priority (this process's rows of `per_row`, over the global
        batch) to the server that sampled it; a server that cannot take it now loses
        that update."""
        if per_row is None:
            return
        local = len(kept["shards"])
        start = self.process_index * local if len(per_row) > local else 0
        self._send_priorities(kept, per_row[start:start + local])

    def _send_priorities(self, routing: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        for index, server in enumerate(self.servers):
            rows = routing["shards"] == index
            if not rows.any():
                continue
            arrays = {"slots": routing["slots"][rows], "generations": routing["generations"][rows],
                      "priorities": priorities[rows].astype(np.float32)}
            try:
                send(server.socket, "priorities", {}, arrays, flags=zmq.NOBLOCK)
                self.priorities_sent += 1
            except zmq.Again:
                self.priorities_dropped += 1

    def waiting_on(self) -> str:
        """Which servers the learner waits for, and why."""
        said = [f"{s.key}: {s.waiting}" for s in self.servers if s.waiting]
        return f"sampled batches from replay ({'; '.join(said) or 'asked'})"

    def counters(self) -> dict[str, int]:
        """Its run counters (`srl_jax.core.metrics_table.CARRIED` that apply) and its own."""
        return {"frames_consumed": self.frames_consumed, "replay_requests": self.requests,
                "replay_timeouts": self.timeouts, "replay_parts_ready": len(self.ready),
                "priorities_sent": self.priorities_sent,
                "priorities_dropped": self.priorities_dropped}

    def restore(self, counters: dict[str, float], recent_returns: list[float]) -> None:
        """Continue the counters of a checkpoint."""
        self.frames_consumed = int(counters.get("frames_consumed", 0))

    def close(self) -> None:
        for server in self.servers:
            server.socket.close()
