"""A PettingZoo parallel env with action masks, and agents that appear and die mid-episode.

`pettingzoo:tests.masked_env` (workers import it from the repository root). Agent
`a_k` plays from step `arrive[k]` until step `leave[k]` (exclusive) of each
`length`-step episode. At every step two of the `ACTIONS` actions are legal,
(t + k) % 4 and (t + k + 1) % 4; the observation shows which (a one-hot of the
first), and choosing that first one earns 1, the second 0. An illegal action, or an
action for an agent out of play, raises: a run that finishes without a crash never
sampled one. Every agent that acted observes the step's outcome (the last one
too). The legal actions come in a Dict observation (`observation`, `action_mask`:
PettingZoo's classic games) or, with `mask_in="infos"`, in
`infos[agent]["action_mask"]`. The env has no `state()`: a centralized critic reads
every agent's observation side by side.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

ACTIONS = 4


class MaskedEnv(ParallelEnv):
    metadata = {"name": "masked_v0"}

    def __init__(self, arrive: tuple[int, ...] = (0, 2), leave: tuple[int, ...] = (8, 5),
                 length: int = 8, mask_in: str = "obs") -> None:
        self.arrive, self.leave, self.length, self.mask_in = arrive, leave, length, mask_in
        self.possible_agents = [f"a_{k}" for k in range(len(arrive))]
        self.agents: list[str] = []
        self._inner = gym.spaces.Box(0.0, 1.0, (ACTIONS + 1,), np.float32)
        self._mask = gym.spaces.MultiBinary(ACTIONS)
        self._obs_space = (gym.spaces.Dict({"observation": self._inner,
                                            "action_mask": self._mask})
                           if mask_in == "obs" else self._inner)
        self._action_space = gym.spaces.Discrete(ACTIONS)

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def _legal(self, agent: str) -> tuple[int, int]:
        first = (self.t + int(agent[2:])) % ACTIONS
        return first, (first + 1) % ACTIONS

    def _in_play(self) -> list[str]:
        return [a for k, a in enumerate(self.possible_agents)
                if self.arrive[k] <= self.t < self.leave[k]]

    def _observe(self, agents: list[str]) -> tuple[dict, dict]:
        obs, infos = {}, {}
        for agent in agents:
            first, second = self._legal(agent)
            view = np.zeros(ACTIONS + 1, np.float32)
            view[first], view[-1] = 1.0, self.t / self.length
            mask = np.zeros(ACTIONS, np.int8)
            mask[[first, second]] = 1
            if self.mask_in == "obs":
                obs[agent] = {"observation": view, "action_mask": mask}
                infos[agent] = {}
            else:
                obs[agent], infos[agent] = view, {"action_mask": mask}
        return obs, infos

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = self._in_play()
        return self._observe(self.agents)

    def step(self, actions: dict) -> tuple:
        if set(actions) != set(self.agents):
            raise ValueError(f"actions for {sorted(actions)}, agents in play {self.agents}")
        rewards = {}
        for agent, action in actions.items():
            first, second = self._legal(agent)
            if action not in (first, second):
                raise ValueError(f"illegal action {action} for {agent} at step {self.t}")
            rewards[agent] = float(action == first)
        self.t += 1
        now = self._in_play() if self.t < self.length else []
        term = {a: a not in now and self.t < self.length for a in actions}
        trunc = {a: self.t >= self.length for a in actions}
        self.agents = now
        obs, infos = self._observe([a for a in self.possible_agents if a in actions or a in now])
        return obs, rewards, term, trunc, {**{a: {} for a in actions}, **infos}


def parallel_env(**kwargs: object) -> MaskedEnv:
    return MaskedEnv(**kwargs)
