"""A split of PettingZoo parallel environments in the env ring: one column per agent.

A `MultiAgentSplit` of `count` environments gives each policy one batch of
columns, env-major: column `env_index * n_agents + position`, where `position`
is the agent's place among its policy's agents (in `possible_agents` order).
Each policy's columns step like an `EnvSplit`'s envs (actors/env_ring.py), so
the same `ChunkBuilder` fills them. Agents map to policies, and the agent ids
ride on observations, as `actors/env_families/parallel_envs.py` says.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from actors.env_families.parallel_envs import (
    ACTION_MASK,
    OBSERVATION,
    agent_policies,
    env_state,
    flat_size,
    is_masked_dict,
    make_parallel_env,
    multi_agent_specs,
)
from actors.env_ring import RingStep, StepResult
from srl_jax.config.schema import EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec


class MultiAgentSplit:
    """`count` PettingZoo parallel environments stepped together, cut into one batch of
    columns per policy (the multi-agent counterpart of `EnvSplit`).

    Each policy's `StepResult` means what an `EnvSplit`'s does, per column:
    rewards, terminated / truncated (truncated only when not terminated), the
    next observations, and for truncated columns their final observations
    (`truncated_envs` holds column indices). An environment's episode ends when
    all its agents are done (`env.agents` is empty): its columns' next
    observations are then the first of a new episode while the step's rewards
    and flags still belong to the old one; each policy's `episode_returns` /
    `episode_lengths` get one entry per agent of that policy in that env (its
    return, and the env steps it acted), and the `RingStep`'s get the team
    return (summed over all agents) and the episode's length in env steps.

    An agent that is done while others still play, or that is not (yet) among
    `env.agents`, is padding: `active` is false, it observes zeros (plus its
    agent id), gets reward 0 and terminated=True on every step until it plays
    again or its env resets, all its actions are legal, and its action is not
    sent to the environment. Its real last step keeps its own flags.

    With action masks (`EnvSpec.action_masked`) each policy's `masks` hold the
    legal actions of its current observations. With `global_state`, `global_state`
    holds each env's state ([count, G]) and every `StepResult` the next ones and,
    where an episode was truncated, its final one.
    """

    def __init__(self, config: EnvConfig, count: int, seeds: list[int],
                 global_state: bool = False) -> None:
        specs = multi_agent_specs(config)
        self.env_id = config.id
        self.envs = [make_parallel_env(config) for _ in range(count)]
        self.possible = list(self.envs[0].possible_agents)
        self.agents = agent_policies(config, self.possible)
        """Policy name -> its agents, in column order within one env."""
        self.policies = list(specs)
        self._sizes = [len(self.agents[p]) for p in self.policies]
        self._columns = [{agent: (p, i * self._sizes[p] + k)
                          for p, name in enumerate(self.policies)
                          for k, agent in enumerate(self.agents[name])} for i in range(count)]
        """Per env: agent -> (policy index, column)."""
        id_dims = [n if config.agent_id and n > 1 else 0 for n in self._sizes]
        self._raw = [slice(0, -ids) if ids else slice(None) for ids in id_dims]
        """Per policy: the part of a row the environment's observation fills."""
        self._blank = []
        """Per policy: observations of dead agents (zeros, plus each column's agent id)."""
        for p, name in enumerate(self.policies):
            spec, n, ids = specs[name], self._sizes[p], id_dims[p]
            blank = np.zeros((count * n, *spec.obs_shape), spec.obs_dtype)
            if ids:
                blank[:, -ids:] = np.tile(np.eye(n, dtype=spec.obs_dtype), (count, 1))
            self._blank.append(blank)
        self._mask_source = [self._source_of(self.envs[0], specs[name], self.agents[name][0])
                             for name in self.policies]
        """Per policy: where its legal actions come from ('obs', 'infos'), or None."""
        self._all_legal = [np.ones((count * n, specs[name].action_dim), bool)
                           if self._mask_source[p] else None
                           for p, (name, n) in enumerate(zip(self.policies, self._sizes,
                                                             strict=True))]
        self._state_size = next(iter(specs.values())).global_state_size if global_state else 0
        self._from_state = config.global_state == "state"
        ends = np.cumsum([flat_size(self.envs[0].observation_space(a)) for a in self.possible])
        self._state_parts = {agent: slice(end - size, end) for agent, end, size in zip(
            self.possible, ends, np.diff(ends, prepend=0), strict=True)}
        """Per agent: its part of a global state made of every agent's observation (for
        an env without `state()`), sized once rather than on every step."""
        self.reset(seeds)

    def reset(self, seeds: list[int]) -> None:
        """Start every env anew from `seeds`, dropping the episodes in play: one split
        replays the same starts again (the evaluator's episodes)."""
        count = len(self.envs)
        self._returns = [np.zeros(count * n, np.float64) for n in self._sizes]
        self._lengths = [np.zeros(count * n, np.int64) for n in self._sizes]
        self._env_lengths = np.zeros(count, np.int64)
        self.obs = [blank.copy() for blank in self._blank]
        """Per policy: the observations the next actions answer, [count * n_agents, ...]."""
        self.masks = [None if legal is None else legal.copy() for legal in self._all_legal]
        """Per policy: the legal actions of `obs` [count * n_agents, A] (None: unmasked)."""
        self.global_state = np.zeros((count, self._state_size), np.float32)
        for i, (env, seed) in enumerate(zip(self.envs, seeds, strict=True)):
            first, infos = env.reset(seed=seed)
            self._put(self.obs, self.masks, i, first, first, infos)
            if self._state_size:
                self.global_state[i] = self._state_of(env, first)

    def __len__(self) -> int:
        return len(self.envs)

    @staticmethod
    def _source_of(env: Any, spec: EnvSpec, agent: str) -> str | None:
        if not spec.action_masked:
            return None
        return "obs" if is_masked_dict(env.observation_space(agent)) else "infos"

    def _column(self, env_index: int, agent: str) -> tuple[int, int]:
        """(policy index, column) of `agent`; a clear error for one the env never declared."""
        try:
            return self._columns[env_index][agent]
        except KeyError:
            raise ValueError(f"'{self.env_id}' returned agent '{agent}', which is not among "
                             f"its possible_agents ({', '.join(self.possible)}): every agent "
                             "must be declared there to get a column") from None

    def _put(self, obs: list[np.ndarray], masks: list[np.ndarray | None], env_index: int,
             agents: Iterable[str], observed: dict, infos: dict) -> None:
        """Write `agents`' observations (and legal actions) into their rows, leaving the
        agent ids in place."""
        for agent in agents:
            p, c = self._column(env_index, agent)
            source, value, mask = self._mask_source[p], observed[agent], masks[p]
            if source == "obs" and mask is not None:
                mask[c] = value[ACTION_MASK]
                value = value[OBSERVATION]
            elif source == "infos" and mask is not None:
                mask[c] = (infos.get(agent) or {}).get(ACTION_MASK, True)
            obs[p][c, self._raw[p]] = np.reshape(value, -1)

    def _state_of(self, env: Any, observed: dict) -> np.ndarray:
        """The env's global state (`state()`, or every agent's observation side by side,
        zeros for agents out of play, where it has none or `env.global_state` says so)."""
        state = env_state(env) if self._from_state else None
        if state is not None:
            return np.asarray(state, np.float32).reshape(-1)
        row = np.zeros(self._state_size, np.float32)
        for agent, part in self._state_parts.items():
            value = observed.get(agent)
            if value is not None:
                if self._mask_source[self._columns[0][agent][0]] == "obs":
                    value = value[OBSERVATION]
                row[part] = np.reshape(value, -1)
        return row

    def step(self, actions: list[list]) -> RingStep:
        """Step every env: `actions[p]` holds one action per column of policy p
        (Python ints, or float32 vectors for Box spaces)."""
        count = len(self.envs)
        rewards = [np.zeros(count * n, np.float32) for n in self._sizes]
        terminated = [np.zeros(count * n, bool) for n in self._sizes]
        truncated = [np.zeros(count * n, bool) for n in self._sizes]
        acted = [np.zeros(count * n, bool) for n in self._sizes]
        next_obs = [blank.copy() for blank in self._blank]
        next_masks = [None if legal is None else legal.copy() for legal in self._all_legal]
        next_state = np.zeros_like(self.global_state)
        final_state = np.zeros_like(self.global_state)
        truncated_cols: list[list[int]] = [[] for _ in self._sizes]
        final_obs: list[list[np.ndarray]] = [[] for _ in self._sizes]
        finished = []
        for i, env in enumerate(self.envs):
            sent = {}
            for agent in env.agents:
                p, c = self._column(i, agent)
                sent[agent] = actions[p][c]
                acted[p][c] = True
            obs, reward, term, trunc, infos = env.step(sent)
            remaining = env.agents
            for agent in sent:
                p, c = self._column(i, agent)
                rewards[p][c] = reward.get(agent, 0.0)
                cut, ended = trunc.get(agent, False), term.get(agent, False)
                if not (cut or ended) and agent not in remaining:
                    ended = True  # left play without a flag: nothing to bootstrap
                if ended:
                    terminated[p][c] = True
                elif cut:
                    truncated[p][c] = True
                    truncated_cols[p].append(c)
                    row = self._blank[p][c].copy()
                    if agent in obs:  # else: nothing to bootstrap from but zeros
                        value = obs[agent]
                        row[self._raw[p]] = np.reshape(
                            value[OBSERVATION] if self._mask_source[p] == "obs" else value, -1)
                    final_obs[p].append(row)
            if self._state_size:
                next_state[i] = self._state_of(env, obs)
                if any(trunc.get(a, False) for a in sent):
                    final_state[i] = next_state[i]
            if remaining:
                self._put(next_obs, next_masks, i, remaining, obs, infos)
            else:
                finished.append(i)
                first, first_infos = env.reset()
                self._put(next_obs, next_masks, i, first, first, first_infos)
                if self._state_size:
                    next_state[i] = self._state_of(env, first)
        self._env_lengths += 1
        for p in range(len(self._sizes)):
            terminated[p] |= ~acted[p]  # done earlier, or not yet in play
            self._returns[p] += rewards[p]
            self._lengths[p] += acted[p]
        self.obs, self.masks, self.global_state = next_obs, next_masks, next_state
        results = []
        for p, n in enumerate(self._sizes):
            returns, lengths = [], []
            for i in finished:
                cols = slice(i * n, (i + 1) * n)
                returns += self._returns[p][cols].tolist()
                lengths += self._lengths[p][cols].tolist()
            final = (np.stack(final_obs[p]) if final_obs[p]
                     else np.empty((0, *next_obs[p].shape[1:]), next_obs[p].dtype))
            results.append(StepResult(rewards[p], terminated[p], truncated[p], next_obs[p],
                                      np.asarray(truncated_cols[p], np.int64), final,
                                      returns, lengths, active=acted[p],
                                      action_mask=next_masks[p], global_state=next_state,
                                      final_global_state=final_state))
        team_returns, team_lengths = [], []
        for i in finished:
            team_returns.append(sum(float(self._returns[p][i * n:(i + 1) * n].sum())
                                    for p, n in enumerate(self._sizes)))
            team_lengths.append(int(self._env_lengths[i]))
            self._env_lengths[i] = 0
            for p, n in enumerate(self._sizes):
                self._returns[p][i * n:(i + 1) * n] = 0.0
                self._lengths[p][i * n:(i + 1) * n] = 0
        return RingStep(results, team_returns, team_lengths)

    def render(self) -> Any:
        """The first env's frame (its `render_mode`'s: a video's rgb_array)."""
        return self.envs[0].render()

    def close(self) -> None:
        for env in self.envs:
            env.close()
