"""The actor worker: steps a ring of environments and streams trajectory chunks.

The ring's S splits take turns: each has at most one inference request in
flight, and while it waits the actor steps whichever split has its answer.
Finished chunks go to the learner on the sample stream (or, for an algorithm
that learns from replay, to the replay servers on the inserts stream); a request
unanswered for `actors.inference_timeout_s` is sent again, to any live
inference server. A value-based (greedy) policy's actions are replaced at
random at each column's rung of Ape-X's epsilon ladder (actors/exploration.py).
In a multi-agent env each policy has its own servers and learner: a split asks
every policy for its agents' actions, steps once all have answered, and sends
each policy the chunk of its own agents. A frozen policy (self-play) gets no
chunks, and one that plays an opponent pool gets, per env and episode, the
snapshot it plays (actors/opponents.py).
With `actors.inline_inference` the actor runs the policy itself instead
(learners/workers/inline_policy.py) and never talks to a server.
A recurrent policy's state lives here, one numpy row per column: each request
carries it, each reply brings the next one, and a column's state is zeroed
when its episode ends, so inference servers stay stateless.
Env seeds derive from the config's seed, the actor's index and its incarnation
(srl_jax/core/incarnation.py): a restarted or resumed actor plays new episodes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import zmq

from actors.env_families.multi_agent import MultiAgentSplit
from actors.env_ring import ChunkBuilder, OnePolicy, RingStep
from actors.envs import env_seed, make_split, policy_spec
from actors.exploration import column_epsilons, explore
from actors.opponents import OpponentDraws, ended_envs
from srl_jax.config.env_families import family_of
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ExperimentConfig,
    member_names,
    policy_names,
)
from srl_jax.core.env_spec import EnvSpec
from srl_jax.core.incarnation import Incarnation
from srl_jax.core.metrics_table import (
    OPPONENT_VERSION,
    POLICY_RETURN,
    TEAM_RETURN,
    agent_mean_returns,
)
from srl_jax.core.names import NameService
from srl_jax.core.stream_table import INFERENCE, INSERTS, SAMPLES
from srl_jax.core.streams import make_socket, receive, send
from srl_jax.core.worker_base import Worker

if TYPE_CHECKING:
    from learners.workers.inline_policy import InlinePolicy

POLL_MS = 100
EXPLORE_STREAM = 1 << 20
"""Env index of the exploration generator's seed (beyond any real env's)."""
OPPONENT_STREAM = EXPLORE_STREAM + 1
"""Env index of the seed of the generator that draws self-play opponents."""
SEND_WAIT_LOG_S = 5.0
MAX_SENT_RETURNS = 256
"""Episode returns a chunk carries to the learner (which ranks checkpoints by them)."""


def split_seeds(config: ExperimentConfig, actor_index: int,
                incarnation: Incarnation) -> list[list[int]]:
    """Each split's env seeds in this start of actor `actor_index`: split s holds the
    actor's envs s*n .. s*n+n-1, each seeded from `env_seed`, anew in every incarnation."""
    per_split = config.actors.envs // config.actors.splits
    return [[incarnation.seed(env_seed(config.seed, actor_index, k))
             for k in range(s * per_split, (s + 1) * per_split)]
            for s in range(config.actors.splits)]


class _Part:
    """One policy's share of a split: its columns' chunk and outstanding request."""

    def __init__(self, obs: np.ndarray, length: int, spec: EnvSpec, mask: np.ndarray | None,
                 global_state: np.ndarray | None) -> None:
        self.spec = spec
        self.chunk = ChunkBuilder(length, obs, spec, mask, global_state)
        self.seq = 0
        self.sent_at = 0.0
        self.sent_wall = 0.0
        self.retry_at = 0.0
        self.delivered = False
        self.request_obs = obs
        self.request_mask = mask
        self.state = np.zeros((len(obs), spec.state_size), np.float32)
        """The recurrent state of each column for its current observation."""
        self.request_state = self.state
        self.answer: tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray] | None = None
        """The policy's reply (action, logp, value, version, new state), held until
        every policy of the split has answered."""
        self.opponents: OpponentDraws | None = None
        """A frozen policy's that plays an opponent pool: each env's snapshot (self-play)."""


class _SplitState:
    """One split's environments and, per policy, its chunk and request."""

    def __init__(self, index: int, split: OnePolicy | MultiAgentSplit, length: int,
                 specs: list[EnvSpec], epsilons: list[np.ndarray]) -> None:
        self.index = index
        self.split = split
        self.parts = [_Part(obs, length, spec, mask, split.global_state)
                      for obs, mask, spec in zip(split.obs, split.masks, specs, strict=True)]
        self.epsilons = epsilons
        """Per policy, each column's exploration rate (empty: act as the policy says)."""


class ActorWorker(Worker):
    kind = "actor"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        self.env_frames = 0
        self.episodes = 0
        self.chunks_sent = 0
        self.chunks_dropped = 0
        self.infer_timeouts = 0
        self.time_env = 0.0
        self.time_wait = 0.0
        self.time_send = 0.0
        self._next_no_server_log = 0.0
        self.inline: InlinePolicy | None = None
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._team_returns: list[float] = []
        self.multi_agent = family_of(config.env).multi_agent
        self.returns_per_policy = self.multi_agent or bool(config.population.members)
        """Heartbeats carry each policy's returns (`policy/<name>/episode_return_mean`)."""
        self.policies: list[str] = []
        self._policy_returns: list[list[float]] = []
        self.pooled: list[int] = []
        """The policies (indices) that play an opponent pool: frozen, `selfplay.opponents`."""
        self._blocked: tuple[str, float] | None = None
        """The sample stream this actor is blocked on (stream full), and since when."""

    def setup(self) -> None:
        cfg, env = self.config.actors, self.config.env
        per_split = cfg.envs // cfg.splits
        population = bool(self.config.population.members)
        self.policies = [self.policy] if population else policy_names(env)
        self.specs = [policy_spec(self.config, policy) for policy in self.policies]
        self.action_bounds = [(np.asarray(spec.action_low, np.float32),
                               np.asarray(spec.action_high, np.float32)) for spec in self.specs]
        self._unsent_returns: list[list[float]] = [[] for _ in self.policies]
        self._policy_returns = [[] for _ in self.policies]
        seeds = split_seeds(self.config, self._seed_index(), self.incarnation)
        self.log.info("resume %d, restart %d: env seeds by split %s", self.incarnation.resumes,
                      self.incarnation.restarts, seeds)
        self.splits = []
        for s, env_seeds in enumerate(seeds):
            ring = make_split(env, per_split, env_seeds,
                              global_state=self.config.network.critic == "global")
            self.splits.append(_SplitState(s, ring, cfg.trajectory_length, self.specs,
                                           self._epsilons(s, ring)))
        self.explore_rng = np.random.default_rng(
            self.incarnation.seed(env_seed(self.config.seed, self.index, EXPLORE_STREAM)))
        stream, count = (INSERTS, self.config.replay.count) if self.config.replay.count \
            else (SAMPLES, self.config.learner.processes)
        self.destination = "replay servers" if stream is INSERTS else "learner"
        self.samples = []
        for policy in self.policies:
            if policy in self.config.selfplay.frozen:  # acts only: no chunks
                self.samples.append(None)
                continue
            socket = make_socket(self.zmq, stream.connect_type, hwm=cfg.send_queue,
                                 kernel_buffer=stream.kernel_buffer)
            for i in range(count):  # chunks are spread over them
                self.connect_to(socket, stream.key(policy, i))
            self.samples.append(socket)
        if cfg.inline_inference:
            from learners.workers.inline_policy import InlinePolicy  # imports JAX

            self.inline = InlinePolicy(self, self.specs[0])
        else:
            self.poller = zmq.Poller()
            self.inference = []
            for policy in self.policies:
                socket = make_socket(self.zmq, INFERENCE.connect_type,
                                     hwm=self.config.inference.request_queue)
                socket.setsockopt(zmq.IMMEDIATE, 1)
                for i in range(self.config.inference.count):
                    self.connect_to(socket, INFERENCE.key(policy, i))
                self.poller.register(socket, zmq.POLLIN)
                self.inference.append(socket)
        self._freeze_parts()
        for state in self.splits:
            for p in range(len(self.policies)):
                self._request(state, p)

    def _freeze_parts(self) -> None:
        """Frozen policies' parts build no chunks; those playing a pool draw opponents."""
        selfplay = self.config.selfplay
        rng = np.random.default_rng(
            self.incarnation.seed(env_seed(self.config.seed, self.index, OPPONENT_STREAM)))
        for state in self.splits:
            for policy, part in zip(self.policies, state.parts, strict=True):
                if policy in selfplay.frozen:
                    part.chunk = None
                if policy in selfplay.opponents:
                    part.opponents = OpponentDraws(len(state.split), part.spec.agents, rng)
        self.pooled = [p for p, policy in enumerate(self.policies)
                       if policy in selfplay.opponents]

    def _seed_index(self) -> int:
        """Which actor this is for its env seeds: members' actors step other episodes."""
        if self.config.population.members:
            return member_names(self.config.population.members).index(self.policy) \
                * self.config.actors.count + self.index
        return self.index

    def _epsilons(self, split: int, ring: OnePolicy | MultiAgentSplit) -> list[np.ndarray]:
        """Each policy's column epsilons in `split` of this actor (none: no epsilon)."""
        cfg = self.config.actors
        if not cfg.epsilon:
            return [np.empty(0) for _ in self.policies]
        return [column_epsilons(cfg.epsilon, cfg.epsilon_alpha, cfg.count, self.index, split,
                                cfg.splits, len(obs)) for obs in ring.obs]

    def _request(self, state: _SplitState, p: int, final_obs: np.ndarray | None = None,
                 final_state: np.ndarray | None = None) -> None:
        """Ask for policy `p`'s actions for the split's observations, and the values of
        the truncated episodes' `final_obs` (acting from their episodes' `final_state`)."""
        part = state.parts[p]
        obs, states, mask = state.split.obs[p], part.state, state.split.masks[p]
        if final_obs is not None and len(final_obs) and part.chunk is not None:
            obs = np.concatenate([obs, final_obs.astype(obs.dtype, copy=False)])
            states = np.concatenate([states, final_state])
            if mask is not None:  # final observations are only valued: any action will do
                mask = np.concatenate([mask, np.ones((len(final_obs), mask.shape[1]), bool)])
        part.request_obs, part.request_state, part.request_mask = obs, states, mask
        if self.inline is None:
            self._send_request(state, p)
        else:
            part.seq += 1

    def _send_request(self, state: _SplitState, p: int) -> None:
        """Send the request of policy `p`'s part; with no server connected, try again shortly."""
        part = state.parts[p]
        part.seq += 1
        part.sent_at, part.sent_wall = time.monotonic(), time.time()
        arrays = {"obs": part.request_obs}
        if part.spec.state_size:
            arrays["state"] = part.request_state
        if part.spec.action_masked:
            arrays["action_mask"] = part.request_mask
        if part.opponents is not None:
            arrays["opponent"] = part.opponents.requested
        try:
            send(self.inference[p], "infer_request", {"split": state.index, "seq": part.seq},
                 arrays, flags=zmq.NOBLOCK)
            part.delivered = True
            part.retry_at = part.sent_at + self.config.actors.inference_timeout_s
        except zmq.Again:  # no server connected yet: try again on the next turn of the loop
            part.delivered = False
            part.retry_at = part.sent_at
            if part.sent_at >= self._next_no_server_log:
                self._next_no_server_log = part.sent_at + SEND_WAIT_LOG_S
                self.log.info("waiting for an inference server of policy '%s' to connect",
                              self.policies[p])

    def run_once(self) -> None:
        if self.inline is not None:
            self._run_inline()
            return
        start = time.perf_counter()
        events = dict(self.poller.poll(POLL_MS))
        self.time_wait += time.perf_counter() - start
        for p, socket in enumerate(self.inference):
            if socket in events:
                while (received := receive(socket, INFERENCE.connecter_receives,
                                           self.rejects)) is not None:
                    self._on_reply(p, received[1].meta, received[1].arrays)
        self._resend_overdue()

    def _run_inline(self) -> None:
        """Act for every split in turn with the policy in this process."""
        for state in self.splits:
            part = state.parts[0]
            start = time.perf_counter()
            meta, arrays = self.inline.act(part.request_obs, part.request_state,
                                           part.request_mask)
            self.time_wait += time.perf_counter() - start
            self._on_reply(0, {**meta, "split": state.index, "seq": part.seq}, arrays)

    def _resend_overdue(self) -> None:
        now = time.monotonic()
        for state in self.splits:
            for p, part in enumerate(state.parts):
                if part.answer is None and now >= part.retry_at:
                    if part.delivered:
                        self.infer_timeouts += 1
                        self.log.warning("split %d: no reply from policy '%s' for %.1fs; "
                                         "sending again", state.index, self.policies[p],
                                         now - part.sent_at)
                    self._send_request(state, p)

    def _on_reply(self, p: int, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        """Check policy `p`'s reply; once every policy of the split has answered, step it."""
        split, seq = meta.get("split"), meta.get("seq")
        if not isinstance(split, int) or not 0 <= split < len(self.splits):
            self.rejects.reject(ValueError(f"reply for unknown split {split!r}"))
            return
        state = self.splits[split]
        part = state.parts[p]
        if seq != part.seq or part.answer is not None:
            return  # the answer to a request we already sent again
        rows = len(part.request_obs)
        try:
            action, logp, value = (arrays[k] for k in ("action", "logp", "value"))
        except KeyError as error:
            self.rejects.reject(ValueError(f"reply without array {error}"))
            return
        if not (logp.shape == value.shape == (rows,)
                and action.shape == (rows, *part.spec.action_shape)):
            self.rejects.reject(ValueError(f"reply shapes {action.shape} for {rows} rows"))
            return
        version = meta.get("version")
        if type(version) is not int:
            self.rejects.reject(ValueError(f"reply with version {version!r}"))
            return
        if not self._valid_actions(action, part.spec):
            self.rejects.reject(ValueError("reply with actions outside the action space"))
            return
        if part.request_mask is not None and not part.request_mask[np.arange(rows), action].all():
            self.rejects.reject(ValueError("reply with actions its masks make illegal"))
            return
        new_state = arrays.get("state") if part.spec.state_size else part.request_state
        if (new_state is None or new_state.shape != (rows, part.spec.state_size)
                or new_state.dtype != np.float32):
            self.rejects.reject(ValueError("reply without the new state of its rows"))
            return
        if part.opponents is not None and \
                (problem := part.opponents.take_reply(meta, arrays, rows)) is not None:
            self.rejects.reject(ValueError(problem))
            return
        part.answer = (action, logp, value, version, new_state)
        if all(other.answer is not None for other in state.parts):
            self._advance(state)

    def _advance(self, state: _SplitState) -> None:
        """Record every policy's answer, step the split, and ask for the next actions."""
        env_actions = []
        for p, part in enumerate(state.parts):
            action, logp, value, version, new_state = part.answer
            n = len(state.split.obs[p])
            if len(state.epsilons[p]):
                action = explore(action[:n], state.epsilons[p], part.spec.action_dim,
                                 self.explore_rng)
            if part.chunk is not None:
                chunk = part.chunk.on_policy(action[:n], logp[:n], value[:n], version,
                                             value[n:], part.request_state[:n])
                if chunk is not None:
                    self._send_chunk(p, chunk)
            env_actions.append(self._env_actions(action[:n], p))
            if part.spec.state_size:
                part.state = np.array(new_state[:n])
        start = time.perf_counter()
        step = state.split.step(env_actions)
        self.time_env += time.perf_counter() - start
        self._account(step, len(state.split))
        if self.pooled:
            ended = ended_envs(step.results, [spec.agents for spec in self.specs])
            for p in self.pooled:
                state.parts[p].opponents.draw(ended)
        for p, (part, result) in enumerate(zip(state.parts, step.results, strict=True)):
            if part.chunk is not None:
                part.chunk.on_step(result)
            part.answer = None
            final_state = part.state[result.truncated_envs]  # valued with their own state
            if part.spec.state_size:
                part.state[result.terminated | result.truncated] = 0.0  # new episodes start
            self._request(state, p, result.final_obs, final_state)

    @staticmethod
    def _valid_actions(action: np.ndarray, spec: EnvSpec) -> bool:
        """Whether every action is in the space (ufunc reductions: no Python wrappers)."""
        if spec.continuous:
            return action.dtype == np.float32 and bool(
                np.logical_and.reduce(np.isfinite(action), axis=None))
        return action.dtype.kind in "iu" and bool(
            np.minimum.reduce(action) >= 0 and np.maximum.reduce(action) < spec.action_dim)

    def _env_actions(self, action: np.ndarray, p: int) -> list:
        """What the envs receive: ints, or vectors clipped to the action space."""
        if self.specs[p].continuous:
            return list(np.clip(action, *self.action_bounds[p]))
        return action.tolist()

    def _account(self, step: RingStep, envs: int) -> None:
        self.env_frames += envs
        self.episodes += len(step.episode_returns)
        if self.multi_agent:  # the ring step's returns are team returns
            self._team_returns.extend(step.episode_returns)
            self._returns.extend(agent_mean_returns(
                step.episode_returns, sum(spec.agents for spec in self.specs)))
        else:
            self._returns.extend(step.episode_returns)
        self._lengths.extend(step.episode_lengths)
        for p, result in enumerate(step.results):
            if self.samples[p] is not None:  # a frozen policy's are sent nowhere
                self._unsent_returns[p].extend(result.episode_returns)
            if self.returns_per_policy:
                self._policy_returns[p].extend(result.episode_returns)

    def _send_chunk(self, p: int, chunk: dict[str, np.ndarray]) -> None:
        """Send a chunk to policy `p`'s learner (or replay servers), with that policy's
        recent returns."""
        start = time.perf_counter()
        meta = {"actor": self.index,
                "episode_returns": self._unsent_returns[p][-MAX_SENT_RETURNS:]}
        self._unsent_returns[p] = []
        try:
            send(self.samples[p], "samples", meta, chunk, flags=zmq.NOBLOCK)
            self.chunks_sent += 1
        except zmq.Again:
            if self.config.actors.send_policy == "drop":
                self.chunks_dropped += 1
            else:
                self._send_blocking(p, meta, chunk, start)
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
        if self._blocked is not None or self.inline is not None:
            return self._blocked
        pending = [(part.sent_wall, p) for state in getattr(self, "splits", [])
                   for p, part in enumerate(state.parts) if part.answer is None and part.seq]
        if not pending:
            return super().waiting()
        since, p = min(pending)
        return f"an inference reply of policy '{self.policies[p]}'", since

    def counters(self) -> dict[str, float]:
        return {
            "env_frames": self.env_frames, "episodes": self.episodes,
            "chunks_sent": self.chunks_sent, "chunks_dropped": self.chunks_dropped,
            "infer_timeouts": self.infer_timeouts, "time_env": self.time_env,
            "time_wait": self.time_wait, "time_send": self.time_send,
        }

    def stats_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"episode_return": np.asarray(self._returns, np.float32),
                  "episode_length": np.asarray(self._lengths, np.int32)}
        self._returns, self._lengths = [], []
        if self.multi_agent:
            arrays[TEAM_RETURN] = np.asarray(self._team_returns, np.float32)
            self._team_returns = []
        if self.returns_per_policy:
            for policy, returns in zip(self.policies, self._policy_returns, strict=True):
                arrays[POLICY_RETURN + policy] = np.asarray(returns, np.float32)
                returns.clear()
        for p in self.pooled:
            draws = [state.parts[p].opponents for state in self.splits]
            arrays[OPPONENT_VERSION + self.policies[p]] = np.asarray(
                [v for d in draws for v in d.played], np.int64)
            for d in draws:
                d.played.clear()
        return arrays

    def close(self) -> None:
        for state in getattr(self, "splits", []):
            state.split.close()
        for name in ("inference", "samples"):
            for socket in getattr(self, name, []):
                if socket is not None:
                    socket.close()
        if self.inline is not None:
            self.inline.close()
