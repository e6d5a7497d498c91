"""The actor worker: the shell that moves its `ActorCore`'s requests, replies and chunks.

The core (actors/actor_core.py) steps the ring and decides what to ask and what to
send; this shell owns the sockets. Requests are spread over the policy's inference
servers (one DEALER connected to all of them by `Worker.socket`); finished chunks go
on the stream the algorithm's declared source chooses (`srl_jax.config.algorithms.chunk_stream`): to
the learner on the samples stream, or to the replay servers on the inserts stream.
A full sample stream drops the chunk or blocks (heartbeating), as
`actors.send_policy` says.
With `actors.inline_inference` the worker kind runs a JAX-side subclass instead
(learners/workers/inline_policy.py), which never talks to a server.
Env seeds derive from the config's seed, the actor's index and its incarnation
(srl_jax/core/incarnation.py): a restarted or resumed actor plays new episodes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zmq

from actors.actor_core import ActorCore, BadReply, Chunk, Request, RingSplit
from actors.envs import env_seed, make_split, policy_spec
from actors.exploration import column_epsilons
from srl_jax.config.algorithms import chunk_stream
from srl_jax.config.env_families import family_of
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ExperimentConfig,
    member_names,
    policy_names,
)
from srl_jax.core.incarnation import Incarnation
from srl_jax.core.names import NameService
from srl_jax.core.stream_table import INFERENCE, INSERTS
from srl_jax.core.streams import receive, send
from srl_jax.core.worker_base import Worker

POLL_MS = 100
EXPLORE_STREAM = 1 << 20
"""Env index of the exploration generator's seed (beyond any real env's)."""
OPPONENT_STREAM = EXPLORE_STREAM + 1
"""Env index of the seed of the generator that draws self-play opponents."""
SEND_WAIT_LOG_S = 5.0


def split_seeds(config: ExperimentConfig, actor_index: int,
                incarnation: Incarnation) -> list[list[int]]:
    """Each split's env seeds in this start of actor `actor_index`: split s holds the
    actor's envs s*n .. s*n+n-1, each seeded from `env_seed`, anew in every incarnation."""
    per_split = config.actors.envs // config.actors.splits
    return [[incarnation.seed(env_seed(config.seed, actor_index, k))
             for k in range(s * per_split, (s + 1) * per_split)]
            for s in range(config.actors.splits)]


class ActorWorker(Worker):
    """Steps its ring of environments (an `ActorCore`) and moves the core's requests,
    replies and chunks over the inference and sample streams."""

    kind = "actor"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        self.chunks_sent = 0
        self.chunks_dropped = 0
        self.time_wait = 0.0
        self.time_send = 0.0
        self._next_no_server_log = 0.0
        self.core: ActorCore | None = None
        self.policies: list[str] = []
        self.samples: list[zmq.Socket | None] = []
        """Per policy, where its chunks go (None: a frozen policy, which gets none)."""
        self.inference: list[zmq.Socket] = []
        self.destination = ""
        self._blocked: tuple[str, float] | None = None
        """The sample stream this actor is blocked on (stream full), and since when."""

    def setup(self) -> None:
        self.core = self._build_core()
        stream = chunk_stream(self.config)
        self.destination = "replay servers" if stream is INSERTS else "learner"
        self.samples = [None if policy in self.config.selfplay.frozen
                        else self.socket(stream, policy, hwm=self.config.actors.send_queue)
                        for policy in self.policies]
        self._connect_inference()
        for request in self.core.start():
            self._send_request(request)

    def _build_core(self) -> ActorCore:
        """The ring this start of the actor steps, its policies and their exploration."""
        config, cfg = self.config, self.config.actors
        population = bool(config.population.members)
        self.policies = [self.policy] if population else policy_names(config.env)
        seeds = split_seeds(config, self._seed_index(), self.incarnation)
        self.log.info("resume %d, restart %d: env seeds by split %s", self.incarnation.resumes,
                      self.incarnation.restarts, seeds)
        splits = [make_split(config.env, cfg.envs // cfg.splits, env_seeds,
                             global_state=config.network.critic == "global")
                  for env_seeds in seeds]
        multi_agent = family_of(config.env).multi_agent
        return ActorCore(
            splits, self.policies, [policy_spec(config, policy) for policy in self.policies],
            cfg.trajectory_length, frozen=config.selfplay.frozen,
            pooled=config.selfplay.opponents, opponent_rng=self._rng(OPPONENT_STREAM),
            epsilons=[self._epsilons(s, split) for s, split in enumerate(splits)]
            if cfg.epsilon else None,
            explore_rng=self._rng(EXPLORE_STREAM), resend_after_s=cfg.inference_timeout_s,
            team_returns=multi_agent, returns_per_policy=multi_agent or population)

    def _connect_inference(self) -> None:
        """A socket to each policy's inference servers (requests spread over them)."""
        self.poller = zmq.Poller()
        for policy in self.policies:
            self.inference.append(self.socket(INFERENCE, policy,
                                              hwm=self.config.inference.request_queue))
            self.poller.register(self.inference[-1], zmq.POLLIN)

    def _rng(self, stream: int) -> np.random.Generator:
        """The generator of this start of the actor seeded for `stream`."""
        return np.random.default_rng(
            self.incarnation.seed(env_seed(self.config.seed, self.index, stream)))

    def _seed_index(self) -> int:
        """Which actor this is for its env seeds: members' actors step other episodes."""
        if self.config.population.members:
            return member_names(self.config.population.members).index(self.policy) \
                * self.config.actors.count + self.index
        return self.index

    def _epsilons(self, split: int, ring: RingSplit) -> list[np.ndarray]:
        """Each policy's column epsilons in `split` of this actor."""
        cfg = self.config.actors
        return [column_epsilons(cfg.epsilon, cfg.epsilon_alpha, cfg.count, self.index, split,
                                cfg.splits, len(obs)) for obs in ring.obs]

    def run_once(self) -> None:
        start = time.perf_counter()
        events = dict(self.poller.poll(POLL_MS))
        self.time_wait += time.perf_counter() - start
        for p, socket in enumerate(self.inference):
            if socket in events:
                # At most one reply per split a turn: a split answered and stepped here asks
                # again, and with envs slower than the server's answer, draining until empty
                # would never end, nor heartbeat (the rest wait for the next turn).
                for _ in range(len(self.core.splits)):
                    received = receive(socket, INFERENCE.connecter_receives, self.rejects)
                    if received is None:
                        break
                    self._on_reply(p, received[1].meta, received[1].arrays)
        for request, waited in self.core.overdue():
            if waited is not None:
                self.log.warning("split %d: no reply from policy '%s' for %.1fs; sending again",
                                 request.split, self.policies[request.policy], waited)
            self._send_request(request)

    def _on_reply(self, p: int, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        """Give policy `p`'s reply to the core; send what an answered split gives."""
        try:
            turn = self.core.on_reply(p, meta, arrays)
        except BadReply as error:
            self.rejects.reject(error)
            return
        if turn is not None:
            for chunk in turn.chunks:
                self._send_chunk(chunk)
            for request in turn.requests:
                self._send_request(request)

    def _send_request(self, request: Request) -> None:
        """Send `request`; with no server connected, the core asks again shortly."""
        try:
            send(self.inference[request.policy], "infer_request", request.meta,
                 request.arrays, flags=zmq.NOBLOCK)
            self.core.sent(request, delivered=True)
        except zmq.Again:  # no server connected yet: try again on the next turn of the loop
            self.core.sent(request, delivered=False)
            now = time.monotonic()
            if now >= self._next_no_server_log:
                self._next_no_server_log = now + SEND_WAIT_LOG_S
                self.log.info("waiting for an inference server of policy '%s' to connect",
                              self.policies[request.policy])

    def _send_chunk(self, chunk: Chunk) -> None:
        """Send a chunk to its policy's learner (or replay servers), with that policy's
        recent returns."""
        start = time.perf_counter()
        meta = {"actor": self.index, "episode_returns": chunk.episode_returns}
        try:
            send(self.samples[chunk.policy], "samples", meta, chunk.arrays, flags=zmq.NOBLOCK)
            self.chunks_sent += 1
        except zmq.Again:
            if self.config.actors.send_policy == "drop":
                self.chunks_dropped += 1
            else:
                self._send_blocking(chunk.policy, meta, chunk.arrays, start)
        self.time_send += time.perf_counter() - start

    def _send_blocking(self, p: int, meta: dict, chunk: dict[str, np.ndarray],
                       start: float) -> None:
        """Send to policy `p`'s learner (or replay servers), waiting (and heartbeating)
        while its stream is full."""
        socket, next_log = self.samples[p], start + SEND_WAIT_LOG_S
        self._blocked = (f"the sample stream of policy '{self.policies[p]}' (full: the "
                         f"{self.destination} cannot take more now)", time.time())
        try:
            while not self.stopping:
                if socket.poll(POLL_MS, zmq.POLLOUT):
                    try:
                        send(socket, "samples", meta, chunk, flags=zmq.NOBLOCK)
                        self.chunks_sent += 1
                        return
                    except zmq.Again:
                        continue
                self.heartbeat()
                if time.perf_counter() > next_log:
                    self.log.info("waiting %.0fs on the %s: sample stream full",
                                  time.perf_counter() - start, self.destination)
                    next_log += SEND_WAIT_LOG_S
        finally:
            self._blocked = None

    def waiting(self) -> tuple[str, float] | None:
        """A blocked send, else the oldest unanswered inference request."""
        if self._blocked is not None:
            return self._blocked
        pending = self.core.oldest_pending() if self.core is not None else None
        if pending is None:
            return super().waiting()
        since, p = pending
        return f"an inference reply of policy '{self.policies[p]}'", since

    def counters(self) -> dict[str, float]:
        core = self.core.counters() if self.core is not None else \
            dict.fromkeys(ActorCore.COUNTERS, 0)
        return {**core, "chunks_sent": self.chunks_sent, "chunks_dropped": self.chunks_dropped,
                "time_wait": self.time_wait, "time_send": self.time_send}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        return self.core.episode_arrays() if self.core is not None else super().stats_arrays()

    def close(self) -> None:
        if self.core is not None:
            self.core.close()
        for socket in [*self.inference, *self.samples]:
            if socket is not None:
                socket.close()
