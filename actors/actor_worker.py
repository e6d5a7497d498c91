"""The actor worker: the shell that moves its `ActorCore`'s requests, replies and chunks.

The core (actors/actor_core.py) steps the ring and decides what to ask and what to
send; this shell owns the streams' ends (`Worker.connect`: each hides whether ZeroMQ or
shared memory carries it). Requests are spread over `inference.servers_per_actor` of the
policy's inference servers (srl_jax/dataflow/fan_in.py); where one is lost, the requests
not yet answered are sent again at once, to the live ones;
finished chunks go on the stream the algorithm's declared source chooses
(`srl_jax.dataflow.algorithms.chunk_stream`): to the learner on the samples stream, or to
the replay servers on the inserts stream.
A full sample stream drops the chunk or blocks (heartbeating), as
`actors.send_policy` says.
With `actors.inline_inference` the worker kind runs a JAX-side subclass instead
(policy/inline_policy.py), which never talks to a server.
Env seeds derive from the config's seed, the actor's index and its incarnation
(srl_jax/runtime/incarnation.py): a restarted or resumed actor plays new episodes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zmq

from actors.actor_core import (
    MAX_SENT_RETURNS,
    ActionRequest,
    ActorCore,
    BadReply,
    Chunk,
    RingSplit,
)
from actors.chunk_sender import ChunkSender
from actors.envs import env_seed, make_split, policy_spec
from actors.exploration import column_epsilons
from actors.priorities import chunk_prioritizer
from srl_jax.config.env_families import family_of
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ExperimentConfig,
    member_names,
    policy_names,
)
from srl_jax.dataflow.algorithms import chunk_overlap, chunk_stream
from srl_jax.dataflow.chunk_spec import run_chunk_layout
from srl_jax.dataflow.shm_layouts import (
    chunk_slot_layout,
    reply_layout,
    request_layout,
)
from srl_jax.dataflow.stream_table import INFERENCE, INSERTS
from srl_jax.runtime.incarnation import Incarnation
from srl_jax.runtime.worker_base import Worker, built
from srl_jax.wire.names import NameService
from srl_jax.wire.stream_ends import Connecter

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


def awaiting_reply(policy: str, since: float) -> tuple[str, float]:
    """What an actor's heartbeat says it waits on: its oldest unanswered request, sent at
    wall time `since` (bench/simulated/swarm_hosts.py sends the same)."""
    return f"an inference reply of policy '{policy}'", since


class ActorWorker(Worker):
    """Steps its ring of environments (an `ActorCore`) and moves the core's requests,
    replies and chunks over the inference and sample streams."""

    kind = "actor"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        self.time_wait = 0.0
        self.time_send = 0.0
        self._next_no_server_log = 0.0
        self._core: ActorCore | None = None
        self.policies: list[str] = []
        self.samples: list[ChunkSender | None] = []
        """Per policy, where its chunks go (None: a frozen policy, which gets none)."""
        self.inference: list[Connecter] = []
        """Per policy, its end of the inference stream."""
        self.poller = zmq.Poller()
        """Replies on the inference stream."""

    @property
    def core(self) -> ActorCore:
        return built(self._core, "the actor core")

    @core.setter
    def core(self, core: ActorCore) -> None:
        self._core = core

    def setup(self) -> None:
        self.core = self._build_core()
        self.samples = [None if policy in self.config.selfplay.frozen
                        else self._chunk_sender(policy) for policy in self.policies]
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
        specs = [policy_spec(config, policy) for policy in self.policies]
        return ActorCore(
            splits, self.policies, specs,
            cfg.trajectory_length, frozen=config.selfplay.frozen,
            pooled=config.selfplay.opponents, opponent_rng=self._rng(OPPONENT_STREAM),
            epsilons=[self._epsilons(s, split) for s, split in enumerate(splits)]
            if cfg.epsilon else None,
            explore_rng=self._rng(EXPLORE_STREAM), resend_after_s=cfg.inference_timeout_s,
            team_returns=multi_agent, returns_per_policy=multi_agent or population,
            prioritize=chunk_prioritizer(config)
            if any(spec.action_values for spec in specs) else None,
            overlap=chunk_overlap(config))

    def _chunk_sender(self, policy: str) -> ChunkSender:
        """Where `policy`'s chunks go: the samples stream to its learner, or the inserts
        stream to its replay servers."""
        config, stream = self.config, chunk_stream(self.config)
        layout = chunk_slot_layout(run_chunk_layout(config, policy_spec(config, policy)),
                                   MAX_SENT_RETURNS)
        destination = f"{'replay servers' if stream is INSERTS else 'learner'} of policy " \
                      f"'{policy}'"
        return ChunkSender(self.connect(stream, layout, policy=policy,
                                        hwm=config.actors.send_queue),
                           destination, config.actors.send_policy == "drop", self.keep_alive)

    def _connect_inference(self) -> None:
        """Each policy's end of the inference stream (requests spread over its servers),
        watched for replies."""
        for policy in self.policies:
            spec = policy_spec(self.config, policy)
            end = self.connect(INFERENCE, request_layout(self.config, spec, policy),
                               reply_layout(self.config, spec, policy), policy,
                               hwm=self.config.inference.request_queue,
                               peers=self.config.inference.servers_per_actor)
            end.register(self.poller)
            self.inference.append(end)

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
        pending = any(end.pending for end in self.inference)
        events = dict(self.poller.poll(0 if pending else POLL_MS))
        self.time_wait += time.perf_counter() - start
        for p, end in enumerate(self.inference):
            if end.ready(events):
                # At most one reply per split a turn: a split answered and stepped here asks
                # again, and with envs slower than the server's answer, draining until empty
                # would never end, nor heartbeat (the rest wait for the next turn).
                for _ in range(len(self.core.splits)):
                    reply = end.receive()
                    if reply is None:
                        break
                    self._on_reply(p, reply.meta, reply.arrays)
        if self.peers_dropped:
            self._resend_dropped()
        for request, waited in self.core.overdue():
            if waited is not None:
                self.log.warning("split %d: no reply from policy '%s' for %.1fs; sending again",
                                 request.split, self.policies[request.policy], waited)
            self._send_request(request)

    def _resend_dropped(self) -> None:
        """Send again every unanswered request of the policies whose sockets lost a server."""
        for p, end in enumerate(self.inference):
            if end.socket in self.peers_dropped:
                requests = self.core.resend(p)
                self.log.info("sending %d unanswered request(s) of policy '%s' again",
                              len(requests), self.policies[p])
                for request in requests:
                    self._send_request(request)
        self.peers_dropped.clear()

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

    def _send_request(self, request: ActionRequest) -> None:
        """Send `request`; with no server connected, the core asks again shortly."""
        delivered = self.inference[request.policy].send(request.meta, request.arrays,
                                                        request.split)
        self.core.sent(request, delivered=delivered)
        if not delivered:
            now = time.monotonic()
            if now >= self._next_no_server_log:
                self._next_no_server_log = now + SEND_WAIT_LOG_S
                self.log.info("waiting for an inference server of policy '%s' to connect",
                              self.policies[request.policy])

    def _send_chunk(self, chunk: Chunk) -> None:
        """Send a chunk to its policy's learner (or replay servers), with that policy's
        recent returns."""
        start = time.perf_counter()
        sender = self.samples[chunk.policy]
        if sender is None:
            raise ValueError(f"a chunk of policy {chunk.policy}, which is frozen")
        sender.send({"actor": self.index, "episode_returns": chunk.episode_returns},
                    chunk.arrays)
        self.time_send += time.perf_counter() - start

    def blocked_send(self) -> tuple[str, float] | None:
        """The sample stream a send waits on (it is full), and since when."""
        for sender in self.samples:
            if sender is not None and sender.blocked_since is not None:
                return (f"the sample stream to the {sender.destination} (full: it cannot "
                        "take more now)", sender.blocked_since)
        return None

    def waiting(self) -> tuple[str, float] | None:
        """A blocked send, else the oldest unanswered inference request."""
        if (blocked := self.blocked_send()) is not None:
            return blocked
        pending = self._core.oldest_pending() if self._core is not None else None
        if pending is None:
            return super().waiting()
        since, p = pending
        return awaiting_reply(self.policies[p], since)

    def counters(self) -> dict[str, float]:
        core = self._core.counters() if self._core is not None else \
            dict.fromkeys(ActorCore.COUNTERS, 0)
        senders = [sender for sender in self.samples if sender is not None]
        return {**core, "chunks_sent": sum(s.sent for s in senders),
                "chunks_dropped": sum(s.dropped for s in senders),
                "time_wait": self.time_wait, "time_send": self.time_send,
                **self.shm_counters()}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        return self._core.episode_arrays() if self._core is not None else \
            super().stats_arrays()

    def close(self) -> None:
        if self._core is not None:
            self._core.close()
        for sender in self.samples:
            if sender is not None:
                sender.close()
        for end in self.inference:
            end.close()
