"""The EnvSpec of a gymnasium environment's spaces (single-agent envs and each PettingZoo agent)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from srl_jax.config import ConfigError
from srl_jax.env_spec import EnvSpec


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
