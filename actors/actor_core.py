"""The actor's core, without sockets: inference replies in, requests and chunks out.

The ring's S splits take turns: each has at most one request in flight per policy,
and a split steps once every policy has answered it. The core asks for actions
(`ActionRequest`s), checks each reply, steps the split, and hands back what the step
finished (`Chunk`s) with the split's next requests; the shell around it
(actors/actor_worker.py) only moves them over sockets, so the core runs, and is
tested, on arrays alone.

A value-based (greedy) policy's actions are replaced at random at each column's
rung of Ape-X's epsilon ladder (actors/exploration.py). In a multi-agent env each
policy answers for its own agents and gets the chunk of its own agents; a frozen
policy (self-play) gets no chunks, and one that plays an opponent pool names, per
env and episode, the snapshot it plays (actors/opponents.py). A request
unanswered for `resend_after_s` is asked again (`overdue`), as is every unanswered
one at once when the shell lost a server (`resend`), and a late reply to the earlier
one is ignored.
A recurrent policy's state lives here, one numpy row per column: each request
carries it, each reply brings the next one, and a column's state is zeroed when
its episode ends, so inference servers stay stateless.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from actors.env_ring import ChunkBuilder, RingStep
from actors.exploration import explore
from actors.opponents import OpponentDraws, ended_envs
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.metrics_table import (
    EPISODE_WIN,
    OPPONENT_VERSION,
    POLICY_RETURN,
    TEAM_RETURN,
    agent_mean_returns,
)

MAX_SENT_RETURNS = 256
"""Episode returns a chunk carries to the learner (which ranks checkpoints by them)."""


class BadReply(ValueError):
    """A reply the core refuses (the shell counts it as a malformed message)."""


class RingSplit(Protocol):
    """A split of the ring as the core steps it (actors/env_ring.py: OnePolicy,
    actors/env_families/multi_agent.py: MultiAgentSplit): per policy its columns' observations and
    legal actions, each env's global state, and one step of every env."""

    @property
    def obs(self) -> Sequence[np.ndarray]: ...

    @property
    def masks(self) -> Sequence[np.ndarray | None]: ...

    @property
    def global_state(self) -> np.ndarray | None: ...

    def __len__(self) -> int: ...

    def step(self, actions: list[list]) -> RingStep: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ActionRequest:
    """Split `split`'s request for actions from policy `policy` (an index in the core's
    policies), as the actor sends it."""

    split: int
    policy: int
    seq: int
    """Counts the split's requests to the policy: a reply names the one it answers."""
    arrays: dict[str, np.ndarray]
    """What it carries: `obs`, and where the policy has them `state`, `action_mask`,
    `opponent` (one row per column, then one per truncated episode's final observation)."""

    @property
    def meta(self) -> dict[str, int]:
        return {"split": self.split, "seq": self.seq}


@dataclass(frozen=True)
class Chunk:
    """A finished [T+1, n] chunk of policy `policy`, with its episodes' recent returns."""

    policy: int
    arrays: dict[str, np.ndarray]
    episode_returns: list[float]


@dataclass
class Turn:
    """What an answered split gives its shell: the chunks it finished, its next requests."""

    chunks: list[Chunk] = field(default_factory=list)
    requests: list[ActionRequest] = field(default_factory=list)


class Answer(NamedTuple):
    """A policy's checked reply to a split's request."""

    action: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    version: int
    state: np.ndarray
    """The rows' new recurrent state ([rows, 0] without a core)."""
    q: np.ndarray | None
    """Every action's Q-value where the spec has `action_values`."""
    search_policy: np.ndarray | None
    """The search's policy over the actions where the spec has `search_policy`."""


class _Part:
    """One policy's share of a split: its columns' chunk and outstanding request."""

    def __init__(self, obs: np.ndarray, length: int, spec: EnvSpec, mask: np.ndarray | None,
                 global_state: np.ndarray | None, chunked: bool, overlap: int) -> None:
        self.spec = spec
        self.chunk = ChunkBuilder(length, obs, spec, mask, global_state, overlap) \
            if chunked else None
        self.action_bounds = (np.asarray(spec.action_low, np.float32),
                              np.asarray(spec.action_high, np.float32))
        self.request: ActionRequest | None = None
        self.sent_at = 0.0
        self.sent_wall = 0.0
        self.retry_at = 0.0
        self.delivered = False
        self.request_obs = obs
        self.request_mask = mask
        self.state = np.zeros((len(obs), spec.state_size), np.float32)
        """The recurrent state of each column for its current observation."""
        self.request_state = self.state
        self.answer: Answer | None = None
        """The policy's reply, held until every policy of the split has answered."""
        self.opponents: OpponentDraws | None = None
        """A frozen policy's that plays an opponent pool: each env's snapshot (self-play)."""

    @property
    def seq(self) -> int:
        return self.request.seq if self.request is not None else 0


class _SplitState:
    """One split's environments and, per policy, its chunk and request."""

    def __init__(self, index: int, split: RingSplit, parts: list[_Part],
                 epsilons: list[np.ndarray]) -> None:
        self.index = index
        self.split = split
        self.parts = parts
        self.epsilons = epsilons
        """Per policy, each column's exploration rate (empty: act as the policy says)."""


class ActorCore:
    """An actor's ring between its replies and its requests and chunks."""

    COUNTERS = ("env_frames", "episodes", "infer_timeouts", "infer_resent", "time_env")
    """What `counters` reports: env steps, finished episodes, requests asked again after
    `resend_after_s`, and after a lost server (`resend`), seconds spent stepping envs."""

    def __init__(self, splits: Sequence[RingSplit], policies: list[str], specs: list[EnvSpec],
                 length: int, *, frozen: Collection[str] = (),
                 pooled: Collection[str] = (),
                 opponent_rng: np.random.Generator | None = None,
                 epsilons: list[list[np.ndarray]] | None = None,
                 explore_rng: np.random.Generator | None = None, resend_after_s: float = 60.0,
                 team_returns: bool = False, returns_per_policy: bool = False,
                 prioritize: Callable[[dict[str, np.ndarray]], None] | None = None,
                 overlap: int = 0) -> None:
        """`splits`: the ring; `policies` and `specs`: who acts in it, in its policy order;
        `length`: T. `frozen` policies get no chunks, `pooled` ones draw an opponent
        snapshot per episode from `opponent_rng`; `epsilons`, per split and policy, each
        column's exploration rate (drawn from `explore_rng`; both generators unseeded
        where not given). `team_returns`: the ring
        reports team returns (multi-agent), averaged per agent for `episode_return`;
        `returns_per_policy`: keep each policy's returns apart too. `prioritize` turns
        a finished chunk's Q-values of the actions taken into its initial priorities, for
        a policy whose spec has `action_values` (actors/priorities.py). `overlap`: steps
        each chunk repeats of the one before, for the learner's burn-in (ChunkBuilder)."""
        self.prioritize = prioritize
        self.policies, self.specs = policies, specs
        self.resend_after_s = resend_after_s
        self.explore_rng = explore_rng if explore_rng is not None else np.random.default_rng()
        opponent_rng = opponent_rng if opponent_rng is not None else np.random.default_rng()
        self.team_returns, self.returns_per_policy = team_returns, returns_per_policy
        self.splits = []
        for s, split in enumerate(splits):
            parts = [_Part(obs, length, spec, mask, split.global_state, policy not in frozen,
                           overlap)
                     for obs, mask, spec, policy in zip(split.obs, split.masks, specs, policies,
                                                        strict=True)]
            for part, policy in zip(parts, policies, strict=True):
                if policy in pooled:
                    part.opponents = OpponentDraws(len(split), part.spec.agents, opponent_rng)
            self.splits.append(_SplitState(s, split, parts, epsilons[s] if epsilons else
                                           [np.empty(0) for _ in policies]))
        self.pooled = [p for p, policy in enumerate(policies) if policy in pooled]
        self.env_frames = 0
        self.episodes = 0
        self.infer_timeouts = 0
        self.infer_resent = 0
        self.time_env = 0.0
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._team_returns: list[float] = []
        self._wins: list[float] = []
        self._policy_returns: list[list[float]] = [[] for _ in policies]
        self._unsent_returns: list[list[float]] = [[] for _ in policies]

    def counters(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.COUNTERS}

    def start(self) -> list[ActionRequest]:
        """The first request of every split to every policy."""
        return [self._ask(state, p) for state in self.splits for p in range(len(self.policies))]

    def latest(self, split: int, policy: int = 0) -> ActionRequest:
        """The newest request of `split` to `policy` (ValueError before `start`)."""
        request = self.splits[split].parts[policy].request
        if request is None:
            raise ValueError(f"split {split} has asked policy {policy} for nothing yet")
        return request

    def on_reply(self, policy: int, meta: dict, arrays: dict[str, np.ndarray]) -> Turn | None:
        """Take `policy`'s reply; once every policy has answered its split, step the split
        and return what it gives. None: the split waits for others, or the reply answers
        a request asked again since. BadReply: a reply the core cannot use."""
        split, seq = meta.get("split"), meta.get("seq")
        if not isinstance(split, int) or not 0 <= split < len(self.splits):
            raise BadReply(f"reply for unknown split {split!r}")
        state = self.splits[split]
        part = state.parts[policy]
        if seq != part.seq or part.answer is not None:
            return None  # the answer to a request we already sent again
        part.answer = _checked(part, meta, arrays)
        if all(other.answer is not None for other in state.parts):
            return self._advance(state)
        return None

    def sent(self, request: ActionRequest, delivered: bool) -> None:
        """The shell sent `request` (`delivered`: a server took it; else none is connected,
        and it is asked again on the next `overdue`)."""
        part = self.splits[request.split].parts[request.policy]
        part.sent_at, part.sent_wall = time.monotonic(), time.time()
        part.delivered = delivered
        part.retry_at = part.sent_at + (self.resend_after_s if delivered else 0.0)

    def overdue(self) -> list[tuple[ActionRequest, float | None]]:
        """The requests to send again, each with the seconds its delivered predecessor
        waited for a reply (None: that one reached no server)."""
        now, again = time.monotonic(), []
        for state in self.splits:
            for p, part in enumerate(state.parts):
                if part.answer is None and now >= part.retry_at:
                    waited = None
                    if part.delivered:
                        waited = now - part.sent_at
                        self.infer_timeouts += 1
                    again.append((self._renew(state, p), waited))
        return again

    def resend(self, policy: int) -> list[ActionRequest]:
        """Every request to `policy` sent and not answered yet, to send again now: the
        server it went to may be gone (the shell lost one)."""
        again = [self._renew(state, policy) for state in self.splits
                 if (part := state.parts[policy]).answer is None and part.seq]
        self.infer_resent += len(again)
        return again

    def oldest_pending(self) -> tuple[float, int] | None:
        """(wall time it was sent, policy) of the oldest request not answered yet."""
        pending = [(part.sent_wall, p) for state in self.splits
                   for p, part in enumerate(state.parts) if part.answer is None and part.seq]
        return min(pending) if pending else None

    def _ask(self, state: _SplitState, p: int, final_obs: np.ndarray | None = None,
             final_state: np.ndarray | None = None) -> ActionRequest:
        """A request for policy `p`'s actions for the split's observations, and the values
        of the truncated episodes' `final_obs` (acting from their episodes' `final_state`)."""
        part = state.parts[p]
        obs, states, mask = state.split.obs[p], part.state, state.split.masks[p]
        if final_obs is not None and len(final_obs) and part.chunk is not None:
            obs = np.concatenate([obs, final_obs.astype(obs.dtype, copy=False)])
            states = np.concatenate([states, final_state])
            if mask is not None:  # final observations are only valued: any action will do
                mask = np.concatenate([mask, np.ones((len(final_obs), mask.shape[1]), bool)])
        part.request_obs, part.request_state, part.request_mask = obs, states, mask
        return self._renew(state, p)

    def _renew(self, state: _SplitState, p: int) -> ActionRequest:
        """Policy `p`'s current request under a new number (a reply to an older one is late)."""
        part = state.parts[p]
        arrays = {"obs": part.request_obs}
        if part.spec.state_size:
            arrays["state"] = part.request_state
        if part.spec.action_masked and part.request_mask is not None:
            arrays["action_mask"] = part.request_mask
        if part.opponents is not None:
            arrays["opponent"] = part.opponents.requested
        request = part.request = ActionRequest(state.index, p, part.seq + 1, arrays)
        return request

    def _advance(self, state: _SplitState) -> Turn:
        """Record every policy's answer, step the split, and ask for the next actions."""
        turn, env_actions = Turn(), []
        for p, part in enumerate(state.parts):
            if part.answer is None:
                raise ValueError(f"split {state.index} stepped before policy {p} answered")
            action, logp, value, version, new_state, q, search_policy = part.answer
            n = len(state.split.obs[p])
            if len(state.epsilons[p]):
                legal = None if part.request_mask is None else part.request_mask[:n]
                action = explore(action[:n], state.epsilons[p], part.spec.action_dim,
                                 self.explore_rng, legal)
            if part.chunk is not None:
                taken = None if q is None else q[np.arange(n), action[:n]]
                chunk = part.chunk.on_policy(
                    action[:n], logp[:n], value[:n], version, value[n:],
                    part.request_state[:n], taken,
                    None if search_policy is None else search_policy[:n])
                if chunk is not None:
                    if taken is not None and self.prioritize is not None:
                        self.prioritize(chunk)
                    turn.chunks.append(Chunk(p, chunk,
                                             self._unsent_returns[p][-MAX_SENT_RETURNS:]))
                    self._unsent_returns[p] = []
            env_actions.append(_env_actions(action[:n], part))
            if part.spec.state_size:
                part.state = np.array(new_state[:n])
        start = time.perf_counter()
        step = state.split.step(env_actions)
        self.time_env += time.perf_counter() - start
        self._account(step, state)
        if self.pooled:
            ended = ended_envs(step.results, [spec.agents for spec in self.specs])
            for part in state.parts:
                if part.opponents is not None:  # a pooled policy's
                    part.opponents.draw(ended)
        for p, (part, result) in enumerate(zip(state.parts, step.results, strict=True)):
            if part.chunk is not None:
                part.chunk.on_step(result)
            part.answer = None
            final_state = part.state[result.truncated_envs]  # valued with their own state
            if part.spec.state_size:
                part.state[result.terminated | result.truncated] = 0.0  # new episodes start
            turn.requests.append(self._ask(state, p, result.final_obs, final_state))
        return turn

    def _account(self, step: RingStep, state: _SplitState) -> None:
        self.env_frames += len(state.split)
        self.episodes += len(step.episode_returns)
        if self.team_returns:  # the ring step's returns are team returns
            self._team_returns.extend(step.episode_returns)
            self._returns.extend(agent_mean_returns(
                step.episode_returns, sum(spec.agents for spec in self.specs)))
        else:
            self._returns.extend(step.episode_returns)
        self._lengths.extend(step.episode_lengths)
        self._wins.extend(step.episode_wins)
        for p, (part, result) in enumerate(zip(state.parts, step.results, strict=True)):
            if part.chunk is not None:  # a frozen policy's are sent nowhere
                self._unsent_returns[p].extend(result.episode_returns)
            if self.returns_per_policy:
                self._policy_returns[p].extend(result.episode_returns)

    def episode_arrays(self) -> dict[str, np.ndarray]:
        """The episodes finished since the last call, as heartbeat arrays."""
        arrays = {"episode_return": np.asarray(self._returns, np.float32),
                  "episode_length": np.asarray(self._lengths, np.int32)}
        self._returns, self._lengths = [], []
        if self.team_returns:
            arrays[TEAM_RETURN] = np.asarray(self._team_returns, np.float32)
            self._team_returns = []
        if self._wins:  # an env that says who won
            arrays[EPISODE_WIN] = np.asarray(self._wins, np.float32)
            self._wins = []
        if self.returns_per_policy:
            for policy, returns in zip(self.policies, self._policy_returns, strict=True):
                arrays[POLICY_RETURN + policy] = np.asarray(returns, np.float32)
                returns.clear()
        for p in self.pooled:
            draws = [d for state in self.splits if (d := state.parts[p].opponents) is not None]
            arrays[OPPONENT_VERSION + self.policies[p]] = np.asarray(
                [v for d in draws for v in d.played], np.int64)
            for d in draws:
                d.played.clear()
        return arrays

    def close(self) -> None:
        for state in self.splits:
            state.split.close()


def _checked(part: _Part, meta: dict, arrays: dict[str, np.ndarray]) -> Answer:
    """A reply to `part`'s request, or BadReply saying what is wrong with it."""
    rows = len(part.request_obs)
    try:
        action, logp, value = (arrays[k] for k in ("action", "logp", "value"))
    except KeyError as error:
        raise BadReply(f"reply without array {error}") from None
    if not (logp.shape == value.shape == (rows,)
            and action.shape == (rows, *part.spec.action_shape)):
        raise BadReply(f"reply shapes {action.shape} for {rows} rows")
    version = meta.get("version")
    if type(version) is not int:
        raise BadReply(f"reply with version {version!r}")
    if not _valid_actions(action, part.spec):
        raise BadReply("reply with actions outside the action space")
    if part.request_mask is not None and not part.request_mask[np.arange(rows), action].all():
        raise BadReply("reply with actions its masks make illegal")
    new_state = arrays.get("state") if part.spec.state_size else part.request_state
    if (new_state is None or new_state.shape != (rows, part.spec.state_size)
            or new_state.dtype != np.float32):
        raise BadReply("reply without the new state of its rows")
    if part.opponents is not None and \
            (problem := part.opponents.take_reply(meta, arrays, rows)) is not None:
        raise BadReply(problem)
    q = arrays.get("q") if part.spec.action_values else None
    if part.spec.action_values and (
            q is None or q.shape != (rows, part.spec.action_dim) or q.dtype != np.float32
            or not np.logical_and.reduce(np.isfinite(q), axis=None)):
        raise BadReply("reply without every action's finite Q-value")
    search_policy = arrays.get("search_policy") if part.spec.search_policy else None
    if part.spec.search_policy and not _is_distribution(search_policy, rows, part.spec):
        raise BadReply("reply without each row's search policy")
    return Answer(action, logp, value, version, new_state, q, search_policy)


def _is_distribution(probs: np.ndarray | None, rows: int, spec: EnvSpec) -> bool:
    """Whether `probs` is [rows, A] float32 probabilities, each row summing to 1."""
    if probs is None or probs.shape != (rows, spec.action_dim) or probs.dtype != np.float32:
        return False
    return bool(np.logical_and.reduce((probs >= 0) & (probs <= 1), axis=None)
                and np.logical_and.reduce(np.abs(probs.sum(1) - 1) < 1e-3))


def _valid_actions(action: np.ndarray, spec: EnvSpec) -> bool:
    """Whether every action is in the space (ufunc reductions: no Python wrappers)."""
    if spec.continuous:
        return action.dtype == np.float32 and bool(
            np.logical_and.reduce(np.isfinite(action), axis=None))
    return action.dtype.kind in "iu" and bool(
        np.minimum.reduce(action) >= 0 and np.maximum.reduce(action) < spec.action_dim)


def _env_actions(action: np.ndarray, part: _Part) -> list:
    """What the envs receive: ints, or vectors clipped to the action space."""
    if part.spec.continuous:
        return list(np.clip(action, *part.action_bounds))
    return action.tolist()
