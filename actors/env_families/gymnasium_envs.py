"""The gymnasium family: any registered gymnasium id (or 'module:EnvId', which imports
the module that registers it), one env object a ring slot."""

from __future__ import annotations

import difflib
import importlib

import gymnasium as gym
import numpy as np

from actors.env_families.implementation import EnvFamilyImplementation
from actors.env_families.spaces import spec_from_spaces
from actors.env_ring import EnvSplit, OnePolicy
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec


class GymnasiumEnvs(EnvFamilyImplementation):
    """Envs of `gymnasium.make`, float64 observations seen as float32 (the families built
    on gymnasium, Atari and MuJoCo, change what they need)."""

    def check_id(self, env: EnvConfig) -> None:
        env_id = env.id
        if ":" in env_id:  # gymnasium's "module:EnvId"
            module, _, env_id = env_id.partition(":")
            try:
                importlib.import_module(module)  # registers the environment
            except Exception as error:
                raise ConfigError(f"'env.id': cannot import '{module}' for '{env.id}': "
                                  f"{error}") from None
        if env_id not in gym.envs.registry:
            close = difflib.get_close_matches(env_id, list(gym.envs.registry), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"'env.id': unknown gymnasium environment '{env_id}'{hint}")

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        try:
            made = self.make_env(env)
        except ConfigError:
            raise
        except Exception as error:  # gymnasium raises many kinds for bad kwargs
            raise ConfigError(f"'env.kwargs': cannot make '{env.id}': {error}") from None
        try:
            return spec_from_spaces(made.observation_space, made.action_space, env.id)
        finally:
            made.close()

    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> OnePolicy:
        return OnePolicy(EnvSplit([self.make_env(env) for _ in seeds], seeds))

    def make_env(self, env: EnvConfig, render_mode: str | None = None) -> gym.Env:
        kwargs = dict(env.kwargs, render_mode=render_mode) if render_mode else env.kwargs
        made = gym.make(env.id, **kwargs)
        space = made.observation_space
        if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
            # MuJoCo and others observe float64; the networks compute in float32, and
            # float32 halves the bytes on the wire.
            limit = np.finfo(np.float32).max
            low, high = (np.where(np.isinf(b), b, np.clip(b, -limit, limit)).astype(np.float32)
                         for b in (space.low, space.high))
            made = gym.wrappers.TransformObservation(
                made, lambda obs: np.asarray(obs, np.float32),
                gym.spaces.Box(low, high, space.shape, np.float32))
        return mask_observations(made, env.mask_obs) if env.mask_obs else made


def mask_observations(env: gym.Env, indices: list[int]) -> gym.Env:
    """`env` with the observation entries at `indices` (flat) replaced by zeros: a
    partially observable version of it. ConfigError naming `env.mask_obs` if the
    indices do not fit its observations."""
    space = env.observation_space
    name = env.spec.id if env.spec is not None else type(env).__name__
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(f"'env.mask_obs' needs Box observations; '{name}' has {space}")
    size = int(np.prod(space.shape))
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < size]
    if bad:
        raise ConfigError(f"'env.mask_obs': {bad} are not indices of the {size} observation "
                          f"entries of '{name}'")
    keep = np.ones(size, bool)
    keep[indices] = False
    keep = keep.reshape(space.shape)
    masked = gym.spaces.Box(np.where(keep, space.low, 0).astype(space.dtype),
                            np.where(keep, space.high, 0).astype(space.dtype), space.shape,
                            space.dtype)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.where(keep, obs, 0).astype(space.dtype, copy=False), masked)


GYMNASIUM = GymnasiumEnvs()
