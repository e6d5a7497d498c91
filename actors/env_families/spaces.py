"""The EnvSpec of a gymnasium environment's spaces (single-agent envs and each PettingZoo agent).

A PettingZoo agent's Discrete observations reach the networks one-hot encoded
(`one_hot_discrete`, applied where `actors.env_families.parallel_envs` makes its envs).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.env_spec import EnvSpec


def spec_from_spaces(obs_space: gym.Space, action_space: gym.Space, env_id: str) -> EnvSpec:
    """The EnvSpec of a pair of spaces; ConfigError for spaces the networks cannot take."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(
            f"'env.id': '{env_id}' has a {type(obs_space).__name__} observation space; "
            "only Box observations are supported so far"
        )
    obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype))
    if isinstance(action_space, gym.spaces.Discrete):
        spec = EnvSpec(*obs, int(action_space.n), continuous=False)
    elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        spec = EnvSpec(*obs, int(action_space.shape[0]), continuous=True,
                       action_low=tuple(float(x) for x in action_space.low),
                       action_high=tuple(float(x) for x in action_space.high))
    else:
        raise ConfigError(
            f"'env.id': '{env_id}' has a {action_space} action space; supported are "
            "Discrete and one-dimensional Box"
        )
    return spec


def one_hot_discrete(env: Any) -> Any:
    """A PettingZoo parallel env whose agents observe a Discrete space (rock-paper-scissors'
    last move) seen as observing its one-hot, a float32 Box the networks take; any
    other env as it is."""
    sizes = {agent: int(space.n) for agent in env.possible_agents
             if isinstance(space := env.observation_space(agent), gym.spaces.Discrete)}
    return OneHotObservations(env, sizes) if sizes else env


class OneHotObservations:
    """A parallel env with the Discrete observations of some agents one-hot encoded; the
    rest of the env's interface passes through."""

    def __init__(self, env: Any, sizes: dict[str, int]) -> None:
        """`sizes`: agent -> the size of its Discrete observation space."""
        self.env = env
        self.sizes = sizes
        self.spaces = {agent: gym.spaces.Box(0.0, 1.0, (n,), np.float32)
                       for agent, n in sizes.items()}

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def observation_space(self, agent: str) -> gym.Space:
        return self.spaces.get(agent) or self.env.observation_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._encode(obs), infos

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        return self._encode(obs), rewards, terminated, truncated, infos

    def _encode(self, obs: dict) -> dict:
        return {agent: np.eye(self.sizes[agent], dtype=np.float32)[value]
                if agent in self.sizes else value for agent, value in obs.items()}
