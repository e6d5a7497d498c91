"""The learner's intake from replay (an `Intake`, learners/intake/intake.py): sampled
batches drawn from its policy's replay servers as from one prioritized memory.

Prioritized replay (Schaul et al. 2016) and Ape-X (Horgan et al. 2018) sample one
distribution over the whole memory, P(i) = p_i^a / sum_j p_j^a, and weight each row by
(N P(i))^-beta. Here the memory is split over shards, so a batch of B rows takes n_k rows
from shard k, drawn multinomially in proportion to the shard's total priority T_k (every
answer carries its server's size N_k and total T_k: the learner knows them as of the
last), and each shard samples its rows by priority within itself. A row of shard k was
then drawn with probability (n_k / B) p_i^a / T_k, from which `shard_weights` gives its
weight over the whole memory, N = sum N_k. A server reports a total of 0 until it holds
`replay.min_size`, so a restarted, refilling shard gets no share until it can serve one.

A batch's requests go out together (a *round*, at most `INFLIGHT` outstanding), and the
batch is whole when every part has come back. A round may ask for `batches` batches at
once (`replay.batches_per_request`): each server draws all their rows in one stratified
sample, and batch j takes every `batches`-th row of it from the j-th on, so that each
batch spans the whole priority range; the priorities of `batches` updates go back in one
message. A server that holds a request (its rate
limiter waits) says so every second. One that says nothing for `SILENCE_S` while asked is
presumed gone: the rounds waiting on it are given up, and it gets no share until it
answers again; a server not asked for `PROBE_S` (no share, or presumed gone) is asked for
0 rows, which it answers at once with its figures. Each part is checked against the
sampled-batch layout (`srl_jax.dataflow.replay_spec`); anything else is counted and dropped.
After the update, `trained` returns each row's new priority to the server it came from,
with the id of that server's memory (`memory_id`): a restarted server, whose memory is
new, ignores the updates meant for its predecessor's.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import zmq

from srl_jax.dataflow.chunk_spec import chunk_error
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import REPLAY_FIELDS, ReplayField, replay_layout
from srl_jax.dataflow.stream_table import REPLAY
from srl_jax.wire.streams import RejectCounter, receive, send

INFLIGHT = 2
"""Rounds (a batch's requests) outstanding."""
SILENCE_S = 5.0
"""A server asked but silent this long is presumed gone; its rounds are given up."""
PROBE_S = 1.0
"""A server not asked for this long is asked for its figures (0 rows)."""


@dataclass
class _Server:
    socket: zmq.Socket
    key: str
    size: int = 0
    total: float | None = None
    """Its samplable total priority as it last said; None: not heard from yet (an equal
    share until it answers)."""
    memory_id: int = 0
    gone: bool = False
    """Presumed gone (silent while asked): no share until it answers again."""
    inflight: dict[int, float] = field(default_factory=dict)
    """seq -> when it was sent (its parts of rounds, and probes)."""
    last_heard: float = 0.0
    last_asked: float = 0.0
    waiting: str = ""
    """Why it holds our requests, as it last said ('' once it answers)."""


@dataclass(eq=False)
class _Round:
    """One batch's requests: server -> (seq, rows), and the parts come back so far."""

    asked: dict[int, tuple[int, int]]
    parts: dict[int, tuple[dict[str, np.ndarray], int, int]] = field(default_factory=dict)
    """server -> (arrays, its size, the id of its memory) when it sampled them."""


def shard_weights(probabilities: np.ndarray, shares: np.ndarray, memory: int,
                  beta: float) -> np.ndarray:
    """Importance weights (N P(i)) ** -beta of rows drawn with probability `probabilities`
    within their shard, each shard giving `shares` (n_k / B, per row) of the batch;
    `memory`: N, the transitions of all shards. The update divides by the largest."""
    return (max(memory, 1) * shares * probabilities) ** -beta


def allocate(rows: int, totals: list[float | None], rng: np.random.Generator) -> np.ndarray:
    """Rows of a batch per server: multinomial in proportion to the known totals, servers
    not heard from yet an equal share beside them; equal shares where no total is known
    to be above 0 (every server refilling: their rate limiters hold the requests)."""
    count = len(totals)
    unknown = np.array([t is None for t in totals])
    known = np.array([0.0 if t is None else t for t in totals])
    if known.sum() <= 0:
        weights = np.ones(count) / count
    else:
        weights = np.where(unknown, 1.0 / count, 0.0)
        weights += (1.0 - unknown.sum() / count) * known / known.sum()
    return rng.multinomial(rows, weights / weights.sum())


class ReplayIntake:
    """Asks, receives, checks and assembles sampled batches; sends back priorities."""

    kept: tuple[str, ...] = ("slots", "generations", "shards", "memory_ids")
    """Where each row came from: its new priority goes back there (never put on the mesh)."""

    def __init__(self, sockets: list[zmq.Socket], keys: list[str], rows: int, window: int,
                 spec: EnvSpec, importance_exponent: float, rejects: RejectCounter,
                 process_index: int, seed: int,
                 fields: tuple[ReplayField, ...] = REPLAY_FIELDS, steps_per_row: int = 1,
                 batches: int = 1, team: int = 1) -> None:
        """`rows` per batch, drawn from all servers; `process_index`: this learner
        process's place in a multi-process batch; `fields`: the sampled batch's
        (`srl_jax.dataflow.replay_spec`), each row training `steps_per_row` steps;
        `batches`: batches per round; `team`: rows that come together (`Replay.teams`:
        a team's agents), which no batch splits."""
        now = time.monotonic()
        self.servers = [_Server(s, k, last_heard=now) for s, k in zip(sockets, keys, strict=True)]
        self.rows, self.window, self.spec = rows, window, spec
        self.batches, self.team = batches, team
        self._trained: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
        """Routing and new priorities of updates whose message has not gone yet."""
        self.fields, self.steps_per_row = fields, steps_per_row
        self.beta = importance_exponent
        self.process_index = process_index
        self.rejects = rejects
        self.rng = np.random.default_rng(seed)
        self.rounds: list[_Round] = []
        """Outstanding rounds, oldest first."""
        self.ready: deque[dict[str, np.ndarray]] = deque()
        self.poller = zmq.Poller()
        for server in self.servers:
            self.poller.register(server.socket, zmq.POLLIN)
        self._seq = 0
        self.frames_consumed = 0
        """Transitions trained on (the learner's samples)."""
        self.requests = 0
        self.timeouts = 0
        self.rounds_given_up = 0
        self.priorities_sent = 0
        self.priorities_dropped = 0
        self.recent_returns: deque[float] = deque()
        """Episode returns never reach a replay learner (the evaluator's rank it)."""

    @property
    def queued(self) -> int:
        """Batches assembled and not yet trained on."""
        return len(self.ready)

    def pump(self, timeout_ms: int, version: int) -> None:
        """Ask, wait up to `timeout_ms` for answers, take them (sampled rows have no
        versions to check)."""
        self._ask()
        if self.ready:
            timeout_ms = 0
        for socket, _ in self.poller.poll(timeout_ms):
            index = next(i for i, s in enumerate(self.servers) if s.socket is socket)
            while (received := receive(socket, REPLAY.connecter_receives,
                                       self.rejects)) is not None:
                self._take(index, received[1].meta, received[1].arrays)
        self._forget_silent()

    def _request(self, index: int, rows: int) -> int | None:
        """Send server `index` a request for `rows` rows; its seq, or None if it cannot
        take one now (not connected yet)."""
        server = self.servers[index]
        self._seq += 1
        try:
            send(server.socket, "sample_request",
                 {"seq": self._seq, "rows": rows, "window": self.window}, flags=zmq.NOBLOCK)
        except zmq.Again:
            return None
        now = time.monotonic()
        if not server.inflight:
            server.last_heard = now
        server.inflight[self._seq] = server.last_asked = now
        self.requests += 1
        return self._seq

    def _ask(self) -> None:
        while len(self.rounds) < INFLIGHT and len(self.ready) <= self.batches:  # no hoarding
            live = [i for i, s in enumerate(self.servers) if not s.gone]
            if not live:
                break
            counts = self.team * allocate(self.rows // self.team,
                                          [self.servers[i].total for i in live], self.rng)
            asked = {}
            for index, rows in zip(live, counts, strict=True):
                rows = int(rows) * self.batches
                if rows and (seq := self._request(index, rows)) is not None:
                    asked[index] = (seq, rows)
                elif rows:  # a round with a part missing is no batch
                    self._drop_seqs(asked)
                    asked = {}
                    break
            if not asked:
                break
            self.rounds.append(_Round(asked))
        now = time.monotonic()
        for index, server in enumerate(self.servers):
            if not server.inflight and now - server.last_asked >= PROBE_S:
                self._request(index, 0)

    def _drop_seqs(self, asked: dict[int, tuple[int, int]]) -> None:
        for index, (seq, _) in asked.items():
            self.servers[index].inflight.pop(seq, None)

    def _take(self, index: int, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        server = self.servers[index]
        seq, size, total, memory_id = (meta.get(k) for k in
                                       ("seq", "size", "total", "memory_id"))
        if type(seq) is not int or seq not in server.inflight:
            return  # the answer to a request given up on
        if not (type(size) is int and size >= 0 and type(memory_id) is int and
                isinstance(total, int | float) and math.isfinite(total) and total >= 0):
            self.rejects.reject(ValueError(f"sampled with size {size!r}, total {total!r}, "
                                           f"memory_id {memory_id!r}"))
            return
        server.last_heard = time.monotonic()
        server.size, server.total, server.memory_id = size, float(total), memory_id
        server.gone = False
        round_ = next((r for r in self.rounds
                       if r.asked.get(index, (None,))[0] == seq), None)
        if not arrays:
            if round_ is None:  # a probe's answer
                del server.inflight[seq]
            else:
                waiting = meta.get("waiting")
                server.waiting = waiting if isinstance(waiting, str) else "waiting"
            return
        del server.inflight[seq]
        if round_ is None:
            return
        error = chunk_error(arrays, replay_layout(round_.asked[index][1], self.window,
                                                  self.spec, self.fields))
        if error is not None:
            self.rejects.reject(ValueError(error.replace("chunk", "sampled batch")))
            self._give_up(round_)
            return
        server.waiting = ""
        round_.parts[index] = (arrays, size, memory_id)
        if len(round_.parts) == len(round_.asked):
            self._give_up(round_)
            self.ready.extend(self._assemble(round_))

    def _give_up(self, round_: _Round) -> None:
        """Forget a round (done, or waiting on a part that will not come)."""
        self.rounds.remove(round_)
        self._drop_seqs(round_.asked)

    def _assemble(self, round_: _Round) -> list[dict[str, np.ndarray]]:
        """The round's batches: the j-th takes teams j, j + batches, ... of every part."""
        order = sorted(round_.parts)
        rows = [round_.asked[i][1] // self.batches for i in order]
        memory = sum(s.size for s in self.servers if not s.gone)
        shares = np.repeat(np.asarray(rows, np.float64) / self.rows, rows)
        memory_ids = np.repeat([round_.parts[i][2] for i in order], rows)
        batches = []
        for j in range(self.batches):
            parts = [{name: self._every_batch(a, j) for name, a in round_.parts[i][0].items()}
                     for i in order]
            batch = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
            batch["shards"] = np.repeat(order, rows)
            batch["memory_ids"] = memory_ids
            batch["weights"] = shard_weights(batch["probabilities"], shares, memory,
                                             self.beta).astype(batch["weights"].dtype)
            self.frames_consumed += len(batch["shards"]) * self.steps_per_row
            batches.append(batch)
        return batches

    def _every_batch(self, rows: np.ndarray, j: int) -> np.ndarray:
        """Teams j, j + batches, ... of a part's `rows`: batch j's share of it."""
        teams = rows.reshape(len(rows) // self.team, self.team, *rows.shape[1:])
        share = teams[j::self.batches]
        return share.reshape(len(share) * self.team, *rows.shape[1:])

    def _forget_silent(self) -> None:
        now = time.monotonic()
        for index, server in enumerate(self.servers):
            if server.inflight and now - server.last_heard > SILENCE_S:
                server.inflight.clear()
                server.gone, server.waiting = True, "silent: presumed gone"
                self.timeouts += 1
                for round_ in [r for r in self.rounds if index in r.asked]:
                    self._give_up(round_)
                    self.rounds_given_up += 1

    def take_batch(self, version: int) -> dict[str, np.ndarray] | None:
        """The next whole batch, or None; its `shards` array says which server each row
        came from, `memory_ids` which memory of it."""
        return self.ready.popleft() if self.ready else None

    def forget_before(self, version: int) -> None:
        """Replay's transitions are off-policy: a copy keeps them."""

    def trained(self, kept: dict[str, np.ndarray], per_row: np.ndarray | None) -> None:
        """Each row's new priority (this process's rows of `per_row`, over the global
        batch) to the server that sampled it, once `batches` updates have some; a server
        that cannot take them then loses those updates."""
        if per_row is None:
            return
        local = len(kept["shards"])
        start = self.process_index * local if len(per_row) > local else 0
        self._trained.append((kept, per_row[start:start + local]))
        if len(self._trained) >= self.batches:
            routing = {name: np.concatenate([k[name] for k, _ in self._trained])
                       for name in self.kept}
            priorities = np.concatenate([p for _, p in self._trained])
            self._trained = []
            self._send_priorities(routing, priorities)

    def _send_priorities(self, routing: dict[str, np.ndarray], priorities: np.ndarray) -> None:
        for index, server in enumerate(self.servers):
            for memory_id in np.unique(routing["memory_ids"][routing["shards"] == index]):
                rows = (routing["shards"] == index) & (routing["memory_ids"] == memory_id)
                arrays = {"slots": routing["slots"][rows],
                          "generations": routing["generations"][rows],
                          "priorities": priorities[rows].astype(np.float32)}
                try:
                    send(server.socket, "priorities", {"memory_id": int(memory_id)},
                         arrays, flags=zmq.NOBLOCK)
                    self.priorities_sent += 1
                except zmq.Again:
                    self.priorities_dropped += 1

    def waiting_on(self) -> str:
        """Which servers the learner waits for, and why."""
        said = [f"{s.key}: {s.waiting}" for s in self.servers if s.waiting]
        return f"sampled batches from replay ({'; '.join(said) or 'asked'})"

    def counters(self) -> dict[str, float]:
        """Its run counters (`srl_jax.dataflow.metrics_table.CARRIED` that apply) and its own."""
        return {"frames_consumed": self.frames_consumed, "replay_requests": self.requests,
                "replay_timeouts": self.timeouts, "replay_batches_ready": len(self.ready),
                "replay_rounds_given_up": self.rounds_given_up,
                "priorities_sent": self.priorities_sent,
                "priorities_dropped": self.priorities_dropped}

    def restore(self, counters: dict[str, float], recent_returns: list[float]) -> None:
        """Continue the counters of a checkpoint."""
        self.frames_consumed = int(counters.get("frames_consumed", 0))

    def close(self) -> None:
        for server in self.servers:
            server.socket.close()
