"""Environment adapters: build gymnasium environments and describe their spaces."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from srl_jax.config import ConfigError, EnvConfig


@dataclass(frozen=True)
class EnvSpec:
    """What the learner and inference servers need to know about an environment."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int


def make_env(config: EnvConfig) -> gym.Env:
    return gym.make(config.id, **config.kwargs)


def env_spec(config: EnvConfig) -> EnvSpec:
    """Spaces of `config`'s environment; ConfigError if this version cannot run it."""
    try:
        env = make_env(config)
    except Exception as error:  # gymnasium raises many kinds for bad kwargs
        raise ConfigError(f"'env.kwargs': cannot make '{config.id}': {error}") from None
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"'env.id': '{config.id}' has a {type(action_space).__name__} action space; "
            "only Discrete actions are supported so far"
        )
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(
            f"'env.id': '{config.id}' has a {type(obs_space).__name__} observation space; "
            "only Box observations are supported so far"
        )
    return EnvSpec(tuple(obs_space.shape), np.dtype(obs_space.dtype), int(action_space.n))


def env_seed(seed: int, actor_index: int, env_index: int) -> int:
    """A distinct, reproducible seed for every environment of every actor."""
    return int(np.random.SeedSequence([seed, actor_index, env_index]).generate_state(1)[0])
