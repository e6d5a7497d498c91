"""The replay server: one shard of a policy's replay, as its own process.

Actors push chunks on the inserts stream; each is checked against the run's
chunk layout and its steps go into a `ReplayBuffer` (replay/buffer.py). Learner
processes send `sample_request`s on the replay stream and get `sampled` batches
back, then send the new `priorities` of what they sampled (transitions, or the whole
chunk columns of R2D2's sequences: replay/sequence_buffer.py). Every answer carries the
server's size in those items, its samplable total priority (0 below
`replay.min_size`) and the id of its memory (`memory_id`, drawn at start), with which
the learner draws one distribution over all shards (learners/intake/replay_intake.py);
a request for 0 rows asks for these alone and is answered at once; priorities meant for
another memory are ignored.
A `RateLimiter` holds the sample-to-insert ratio: while inserts run ahead the server
stops reading the inserts stream (the actors' sends block, or drop by
`actors.send_policy`); while samples run ahead it holds the learner's requests and
tells it every `WAIT_NOTICE_S` that it is alive and waiting, and why. Both waits are
counted.

The contents live in this process only: a replay server that dies loses them and
is restarted empty; the learner samples from the other shards meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from pathlib import Path
from typing import NamedTuple

import numpy as np
import zmq

from actors.actor_core import MAX_SENT_RETURNS
from actors.envs import policy_spec
from replay.buffer import ReplayBuffer
from replay.position_buffer import PositionBuffer
from replay.rate_limiter import RateLimiter, error_buffer
from replay.sequence_buffer import SequenceBuffer
from replay.team_buffer import TeamBuffer
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig
from srl_jax.dataflow.algorithms import chunk_overlap, replay_of, sampled_window
from srl_jax.dataflow.chunk_spec import chunk_error, run_chunk_layout
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.shm_layouts import chunk_slot_layout
from srl_jax.dataflow.stream_table import INSERTS, REPLAY
from srl_jax.runtime.memory import resident_mib
from srl_jax.runtime.worker_base import Worker, built
from srl_jax.wire.names import NameService
from srl_jax.wire.stream_ends import Binder
from srl_jax.wire.streams import receive, send

POLL_MS = 20
MAX_DRAIN = 64
"""Chunks taken off the inserts stream per turn at most."""
WAIT_NOTICE_S = 1.0
"""A held sample request is answered this often with an empty `sampled` (a notice)."""
MAX_ROWS = 1 << 16
"""Largest sample request served; anything larger is malformed."""
MAX_WINDOW = 1 << 10


class Pending(NamedTuple):
    routing: list[bytes]
    seq: int
    rows: int
    window: int
    since: float


def priorities_error(arrays: dict[str, np.ndarray]) -> str | None:
    """What is wrong with a `priorities` message's arrays; None if nothing is."""
    expected = {"slots": "iu", "generations": "iu", "priorities": "f"}
    if arrays.keys() != expected.keys():
        return f"priorities with arrays {sorted(arrays)}"
    lengths = {a.shape for a in arrays.values()}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        return f"priorities arrays of shapes {sorted(lengths)}: want one length, 1-D"
    for name, kinds in expected.items():
        if arrays[name].dtype.kind not in kinds:
            return f"priorities array {name!r} of dtype {arrays[name].dtype}"
    return None


def replay_buffer(config: ExperimentConfig, spec: EnvSpec, T: int, columns: int,
                  seed: int) -> ReplayBuffer:
    """The storage the run's algorithm samples (`Replay`): n-step transitions, whole
    sequences, teams of sequences, or positions of sequences stored with a tail."""
    cfg, sampling = config.replay, replay_of(config)
    args = (cfg.capacity, T, columns, spec, spec.frame_stack, cfg.priority_exponent,
            cfg.importance_exponent, seed, sampling.fields)
    if sampling.positions:
        return PositionBuffer(*args, positions=T - chunk_overlap(config),
                              window=sampled_window(config))
    if sampling.teams:
        return TeamBuffer(*args)
    return (SequenceBuffer if sampling.sequences else ReplayBuffer)(*args)


class ReplayWorker(Worker):
    kind = "replay"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        cfg = config.replay
        self.spec = policy_spec(config, policy)
        self.layout = run_chunk_layout(config, self.spec)
        T, columns = self.layout["actions"][0][:2]
        self.buffer = replay_buffer(config, self.spec, T, columns,
                                    config.seed * 1009 + index + self.incarnation.seed(0))
        self.limiter = RateLimiter(cfg.min_size, cfg.samples_per_insert,
                                   error_buffer(cfg.min_size, cfg.tolerance,
                                                cfg.samples_per_insert))
        self.memory_id = int.from_bytes(os.urandom(6), "big")
        """Names this server's memory in its answers: a restarted server's is new, and
        priority updates for its predecessor's are ignored."""
        self.pending: deque[Pending] = deque()
        self.inserted = 0
        self.sampled = 0
        self.chunks = 0
        self.priority_updates = 0
        self.priorities_stale = 0
        self.time_insert_wait = 0.0
        self.time_sample_wait = 0.0
        self.time_insert = 0.0
        self.time_sample = 0.0
        self._insert_blocked_since: float | None = None
        self._last_notice = 0.0
        self._inserts: Binder | None = None
        """Its end of the inserts stream, once `setup` has bound it."""
        self._router: zmq.Socket | None = None
        """Its socket of the replay stream, once `setup` has bound it."""

    @property
    def inserts(self) -> Binder:
        return built(self._inserts, "the inserts stream's end")

    @property
    def router(self) -> zmq.Socket:
        return built(self._router, "the replay socket")

    def setup(self) -> None:
        self._inserts = self.bind(INSERTS, [chunk_slot_layout(self.layout, MAX_SENT_RETURNS)],
                                  hwm=self.config.actors.send_queue)
        self._router = self.socket(REPLAY)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.log.info("capacity %d transitions in %.1f MiB (frame stack %d)",
                      self.config.replay.capacity, self.buffer.nbytes / 2**20,
                      self.spec.frame_stack)

    def run_once(self) -> None:
        can_insert = self.limiter.can_insert()
        self._note_insert_wait(can_insert)
        self.inserts.register(self.poller, zmq.POLLIN if can_insert else 0)  # 0: unregister
        waiting = can_insert and self.inserts.pending
        events = dict(self.poller.poll(0 if self._servable() or waiting else POLL_MS))
        if self.router in events:
            self._take_requests()
        if can_insert and self.inserts.ready(events):
            self._take_inserts()
        self._serve()

    def _note_insert_wait(self, can_insert: bool) -> None:
        now = time.perf_counter()
        if can_insert and self._insert_blocked_since is not None:
            self.time_insert_wait += now - self._insert_blocked_since
            self._insert_blocked_since = None
        elif not can_insert and self._insert_blocked_since is None:
            self._insert_blocked_since = now

    def _servable(self) -> bool:
        return bool(self.pending) and self.limiter.can_sample(self.buffer.size)

    def _take_inserts(self) -> None:
        start = time.perf_counter()
        self.inserts.rotate()
        for _ in range(MAX_DRAIN):
            if not self.limiter.can_insert():
                break
            received = self.inserts.receive()
            if received is None:
                break
            arrays = received[1].arrays
            error = chunk_error(arrays, self.layout)
            if error is None and not np.logical_and.reduce(
                    np.isfinite(arrays["priorities"]) & (arrays["priorities"] >= 0), axis=None):
                error = "chunk with priorities not finite and >= 0"
            if error is not None:
                self.rejects.reject(ValueError(error))
                continue
            steps = self.buffer.insert(arrays)
            self.limiter.inserted(steps)
            self.inserted += steps
            self.chunks += 1
        self.time_insert += time.perf_counter() - start

    def _take_requests(self) -> None:
        while (received := receive(self.router, REPLAY.binder_receives, self.rejects,
                                   envelope=1)) is not None:
            routing, message = received
            if message.kind == "priorities":
                self._update_priorities(message.meta, message.arrays)
            else:
                self._queue_request(routing, message.meta)

    def _queue_request(self, routing: list[bytes], meta: dict) -> None:
        seq, rows, window = (meta.get(k) for k in ("seq", "rows", "window"))
        if not (type(seq) is int and type(rows) is int and type(window) is int
                and 0 <= rows <= MAX_ROWS and 0 < window <= MAX_WINDOW
                and self.buffer.sampled_window in (None, window)):
            self.rejects.reject(ValueError(f"sample_request with seq {seq!r}, rows {rows!r}, "
                                           f"window {window!r}"))
            return
        request = Pending(routing, seq, rows, window, time.perf_counter())
        if rows:
            self.pending.append(request)
        else:  # the learner asks for the figures alone
            self._reply(request, {})

    def _update_priorities(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        error = priorities_error(arrays)
        memory_id = meta.get("memory_id")
        if error is None and type(memory_id) is not int:
            error = f"priorities for memory {memory_id!r}"
        if error is None and memory_id != self.memory_id:
            self.priorities_stale += len(arrays["slots"])  # sampled from a predecessor
            return
        if error is None:
            try:
                applied = self.buffer.update_priorities(
                    arrays["slots"].astype(np.int64), arrays["generations"].astype(np.int64),
                    arrays["priorities"].astype(np.float64))
            except ValueError as bad:
                error = str(bad)
        if error is not None:
            self.rejects.reject(ValueError(error))
            return
        self.priority_updates += 1
        self.priorities_stale += len(arrays["slots"]) - applied

    def _serve(self) -> None:
        """Answer held requests in order while the rate limiter lets samples through."""
        now = time.perf_counter()
        while self.pending and self.limiter.can_sample(self.buffer.size):
            request = self.pending.popleft()
            self.time_sample_wait += now - request.since
            start = time.perf_counter()
            batch = self.outgoing(self.buffer.sample(request.rows, request.window))
            steps = request.rows * self.buffer.steps_per_item
            self.limiter.sampled(steps)  # samples_per_insert counts steps, as inserts do
            self.sampled += steps
            self.time_sample += time.perf_counter() - start
            self._reply(request, batch)
        if self.pending and now - self._last_notice >= WAIT_NOTICE_S:
            self._last_notice = now
            for request in self.pending:
                self._reply(request, {}, waiting=self._why_waiting())

    def outgoing(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A sampled batch as it is sent (a subclass may renew its targets first)."""
        return batch

    def _reply(self, request: Pending, arrays: dict[str, np.ndarray],
               waiting: str | None = None) -> None:
        size = self.buffer.size
        total = self.buffer.tree.total if size >= self.config.replay.min_size else 0.0
        meta = {"seq": request.seq, "size": self.buffer.items, "total": total,
                "memory_id": self.memory_id, **({"waiting": waiting} if waiting else {})}
        with contextlib.suppress(zmq.Again):  # the learner is gone or full: it asks again
            send(self.router, "sampled", meta, arrays, routing=request.routing,
                 flags=zmq.NOBLOCK)

    def _why_waiting(self) -> str:
        if self.buffer.size < self.config.replay.min_size:
            return f"min_size: {self.buffer.size} of {self.config.replay.min_size} transitions"
        return "samples_per_insert: sampling is ahead of inserts"

    def waiting(self) -> tuple[str, float] | None:
        """Inserts held back by the ratio, or held sample requests."""
        if self._insert_blocked_since is not None:
            return ("the learner's samples: inserts are ahead of samples_per_insert",
                    time.time() - (time.perf_counter() - self._insert_blocked_since))
        if self.pending:
            return (f"inserts on {INSERTS.key(self.policy, self.index)} ({self._why_waiting()})",
                    time.time() - (time.perf_counter() - self.pending[0].since))
        return super().waiting()

    def counters(self) -> dict[str, float]:
        stats = self.buffer.priority_stats()
        blocked = (time.perf_counter() - self._insert_blocked_since
                   if self._insert_blocked_since is not None else 0.0)
        return {
            "size": self.buffer.size, "inserted": self.inserted, "sampled": self.sampled,
            "chunks": self.chunks, "priority_updates": self.priority_updates,
            "priorities_stale": self.priorities_stale,
            "time_insert_wait": self.time_insert_wait + blocked,
            "time_sample_wait": self.time_sample_wait + sum(
                time.perf_counter() - r.since for r in self.pending),
            "time_insert": self.time_insert, "time_sample": self.time_sample,
            "pending_requests": len(self.pending),
            "storage_mb": self.buffer.nbytes / 2**20, "rss_mb": resident_mib() or 0.0,
            **self.shm_counters(),
            **{f"priority_{k}": v for k, v in stats.items()},
        }

    def close(self) -> None:
        for end in (self._inserts, self._router):
            if end is not None:
                end.close()
