"""The env ring: K environments cut into S splits, and the trajectory chunks they fill.

An `EnvSplit` steps its environments and resets finished ones itself, so the
observation after a finished step is the first of a new episode while the
step's reward and flags still belong to the old one (gymnasium's vector envs
would instead hand back the reset one step later). For a truncated episode the
final observation is kept, so its value can bootstrap the return.

A `ChunkBuilder` fills one split's chunk of T steps with the arrays that
`srl_jax.dataflow.chunk_spec.CHUNK_FIELDS` declares (names, shapes, dtypes and meanings).

Consecutive chunks overlap by one observation: the last of one is the first of
the next. In a multi-agent env (actors/env_families/multi_agent.py) every agent is a column
of its policy's chunk, so `n` is envs times that policy's agents.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol

import gymnasium as gym
import numpy as np

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec


@dataclass
class StepResult:
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: np.ndarray
    truncated_envs: np.ndarray
    """Indices (within the split) of envs cut by a time limit this step."""
    final_obs: np.ndarray
    """Their final observations, one row each, to be valued for bootstrapping."""
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    active: np.ndarray | None = None
    """Columns whose agent acted this step (None: all; see actors/env_families/multi_agent.py)."""
    action_mask: np.ndarray | None = None
    """Legal actions of `next_obs`, [n, A] (None: the env masks nothing)."""
    global_state: np.ndarray | None = None
    """Each env's global state at `next_obs`, [envs, G] (None: not wanted)."""
    final_global_state: np.ndarray | None = None
    """Each env's global state at its final observation where truncated, [envs, G]."""


@dataclass
class RingStep:
    """One step of a split, cut per policy (a single-agent split has one policy)."""

    results: list[StepResult]
    """Per policy, in the split's policy order: its columns' rewards, flags and
    observations; its `episode_returns` are those of single agents."""
    episode_returns: list[float]
    """Returns of the episodes that ended, summed over all agents (the team return)."""
    episode_lengths: list[int]
    """Their lengths in environment steps."""
    episode_wins: list[float] = field(default_factory=list)
    """Whether each of them was won (1.0) or not (0.0), where the env says (SMAX); else
    empty."""


class EnvSplit:
    """A group of environments that step together and share one inference request."""

    def __init__(self, envs: list[gym.Env], seeds: list[int]) -> None:
        self.envs = envs
        first = [env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)]
        self.obs = np.stack(first)
        self.returns = np.zeros(len(envs), np.float64)
        self.lengths = np.zeros(len(envs), np.int64)

    def __len__(self) -> int:
        return len(self.envs)

    def step(self, actions: list) -> StepResult:
        """Step every env with its action (Python ints, or float arrays for Box spaces)."""
        n = len(self.envs)
        rewards = np.zeros(n, np.float32)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        next_obs = np.empty_like(self.obs)
        truncated_envs, final_obs, ended = [], [], []
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            obs, reward, term, trunc, info = env.step(action)
            rewards[i] = reward
            if term or trunc:
                terminated[i] = term
                truncated[i] = trunc and not term
                if truncated[i]:
                    truncated_envs.append(i)
                    final_obs.append(np.array(obs, copy=True))  # reset may reuse the buffer
                if info.get("game_over", True):  # a lost life (EpisodicLife) is not the end
                    ended.append(i)
                obs, _ = env.reset()
            next_obs[i] = obs
        self.obs = next_obs
        # Totals once per step, not per env: the per-env loop is the actor's hot path.
        self.returns += rewards
        self.lengths += 1
        returns = self.returns[ended].tolist()
        lengths = self.lengths[ended].tolist()
        self.returns[ended] = 0.0
        self.lengths[ended] = 0
        final = np.stack(final_obs) if final_obs else np.empty((0, *self.obs.shape[1:]),
                                                              self.obs.dtype)
        return StepResult(rewards, terminated, truncated, next_obs,
                          np.asarray(truncated_envs, np.int64), final, returns, lengths)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class SingleAgentSplit(Protocol):
    """Single-agent envs that step together: an `EnvSplit`, or EnvPool's batch
    (actors/env_families/envpool_split.py)."""

    @property
    def obs(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def step(self, actions: list) -> StepResult: ...

    def close(self) -> None: ...


class OnePolicy:
    """A single-agent split (EnvSplit or EnvPoolSplit) seen as a ring split of one policy."""

    def __init__(self, split: SingleAgentSplit) -> None:
        self.split = split
        self.policies = [DEFAULT_POLICY]

    def __len__(self) -> int:
        return len(self.split)

    @property
    def obs(self) -> list[np.ndarray]:
        return [self.split.obs]

    masks: list[None] = [None]
    """No legal-action masks: single-agent envs leave every action legal."""
    global_state = None
    """No global state: a centralized critic is for multi-agent envs."""

    def step(self, actions: list[list]) -> RingStep:
        result = self.split.step(actions[0])
        return RingStep([result], result.episode_returns, result.episode_lengths)

    def close(self) -> None:
        self.split.close()


class ChunkBuilder:
    """Fills [T+1, n] trajectory chunks for one split, one step at a time.

    With an `overlap` of K steps (`Sizes.overlap`: a recurrent learner's burn-in, which
    the previous chunk trained on; R2D2's all but its period), each chunk after the first
    starts with the last K steps of the one before, and its stored state is the one the
    policy acted from at the first of them (R2D2's overlapping sequences)."""

    def __init__(self, length: int, first_obs: np.ndarray, spec: EnvSpec,
                 first_mask: np.ndarray | None = None,
                 first_state: np.ndarray | None = None, overlap: int = 0) -> None:
        """`first_obs`: the split's current observations, one row per column; with
        action masks, `first_mask` their legal actions; with a centralized critic,
        `first_state` each env's global state."""
        self.length = length
        self.overlap = overlap
        self.n = first_obs.shape[0]
        self.spec = spec
        self._pending_truncated = np.empty(0, np.int64)
        self._mask = first_mask
        self._starts: collections.deque[np.ndarray] = collections.deque()
        """The states the policy acted from at the steps where later chunks start (every
        T - K steps; with K > T / 2 several lie ahead), oldest first."""
        self._new_chunk(first_obs, first_state)

    def _new_chunk(self, first_obs: np.ndarray, first_state: np.ndarray | None) -> None:
        self.t = 0
        self.arrays = empty_chunk(self.length, self.n, self.spec)
        self.arrays["obs"][0] = first_obs
        if self.spec.global_state_size:
            self.arrays["global_state"][0] = first_state

    def _next_chunk(self, finished: dict[str, np.ndarray]) -> None:
        """The chunk after `finished`: its last K steps (and the observation after them)
        copied to the start, and the state they were acted from."""
        T, K = self.length, self.overlap
        self._new_chunk(finished["obs"][T], finished["global_state"][T])
        if not K:
            return
        for name, array in self.arrays.items():
            if name == "state":
                array[0] = self._starts.popleft()
            elif len(array) == T + 1:
                array[:K + 1] = finished[name][T - K:]
            elif len(array) == T:
                array[:K] = finished[name][T - K:]
        self.t = K

    def on_policy(self, action: np.ndarray, logp: np.ndarray, value: np.ndarray,
                  version: int, trunc_values: np.ndarray, state: np.ndarray,
                  taken_q: np.ndarray | None = None,
                  search_policy: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
        """Record the policy's answer for the current observation.

        `trunc_values` are the values of the final observations of the envs
        truncated on the previous step (in `StepResult.truncated_envs` order,
        given again in `truncated_envs` of the previous `on_step`); `state` is
        the recurrent state the policy acted from, kept when this step is a
        chunk's first; `taken_q`, where the spec has `action_values`, the Q-value of
        each action taken, kept in `priorities` until the chunk is finished
        (actors/priorities.py); `search_policy`, where the spec has it, the search's
        policy at each column. Returns a finished chunk when this answer completes one.
        """
        a = self.arrays
        if self.t > 0 and len(self._pending_truncated):
            a["trunc_values"][self.t - 1, self._pending_truncated] = trunc_values
        self._pending_truncated = np.empty(0, np.int64)
        a["values"][self.t] = value
        finished = None
        if self.t == self.length:
            finished = a
            self._next_chunk(a)
            self.arrays["values"][self.t] = value
        a = self.arrays
        if self.t == 0:
            a["state"][0] = state
        if self.overlap and self.t % (self.length - self.overlap) == 0 and self.t:
            self._starts.append(np.array(state))
        if self.spec.action_masked:
            a["action_mask"][self.t] = self._mask
        a["actions"][self.t] = action
        a["logp"][self.t] = logp
        a["versions"][self.t] = version
        if taken_q is not None:
            a["priorities"][self.t, :, 0] = taken_q
        if search_policy is not None:
            a["search_policy"][self.t] = search_policy
        return finished

    def on_step(self, result: StepResult) -> None:
        """Record the environments' answer to the current actions."""
        a, t = self.arrays, self.t
        a["rewards"][t] = result.rewards
        a["terminated"][t] = result.terminated
        a["truncated"][t] = result.truncated
        a["obs"][t + 1] = result.next_obs
        if result.active is not None:
            a["active"][t] = result.active
        if self.spec.global_state_size:
            a["global_state"][t + 1] = result.global_state
            a["trunc_global_state"][t] = result.final_global_state
        if self.spec.final_obs and len(result.truncated_envs):
            a["final_obs"][t, result.truncated_envs] = result.final_obs
        self._mask = result.action_mask
        self._pending_truncated = result.truncated_envs
        self.t = t + 1
