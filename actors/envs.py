"""Environment adapters: build gymnasium environments and describe their spaces."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np

from actors.atari import is_atari, make_atari
from actors.spaces import spec_from_spaces
from srl_jax.config.checks import check_request_rows
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ConfigError,
    EnvConfig,
    ExperimentConfig,
    is_pettingzoo,
    policy_names,
)
from srl_jax.core.env_spec import EnvSpec, check_network, with_network


def make_env(config: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """A gymnasium environment, or an Atari game with its preprocessing (actors/atari.py)."""
    if is_atari(config.id):
        if config.mask_obs:
            raise ConfigError("'env.mask_obs' is for vector observations, not Atari frames")
        return make_atari(config, render_mode)
    kwargs = dict(config.kwargs, render_mode=render_mode) if render_mode else config.kwargs
    env = gym.make(config.id, **kwargs)
    space = env.observation_space
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
        # MuJoCo and others observe float64; the networks compute in float32, and
        # float32 halves the bytes on the wire.
        limit = np.finfo(np.float32).max
        bounds = [np.where(np.isinf(b), b, np.clip(b, -limit, limit)).astype(np.float32)
                  for b in (space.low, space.high)]
        env = gym.wrappers.TransformObservation(
            env, lambda obs: np.asarray(obs, np.float32),
            gym.spaces.Box(*bounds, space.shape, np.float32))
    return mask_observations(env, config.mask_obs) if config.mask_obs else env


def mask_observations(env: gym.Env, indices: list[int]) -> gym.Env:
    """`env` with the observation entries at `indices` (flat) replaced by zeros: a
    partially observable version of it. ConfigError naming `env.mask_obs` if the
    indices do not fit its observations."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(f"'env.mask_obs' needs Box observations; '{env.spec.id}' has {space}")
    size = int(np.prod(space.shape))
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < size]
    if bad:
        raise ConfigError(f"'env.mask_obs': {bad} are not indices of the {size} observation "
                          f"entries of '{env.spec.id}'")
    keep = np.ones(size, bool)
    keep[indices] = False
    keep = keep.reshape(space.shape)
    masked = gym.spaces.Box(np.where(keep, space.low, 0).astype(space.dtype),
                            np.where(keep, space.high, 0).astype(space.dtype), space.shape,
                            space.dtype)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.where(keep, obs, 0).astype(space.dtype, copy=False), masked)


def env_spec(config: EnvConfig, policy: str = DEFAULT_POLICY) -> EnvSpec:
    """Spaces of `config`'s environment as `policy` sees them; ConfigError if this
    version cannot run it. A single-agent environment has one policy, the default."""
    if is_pettingzoo(config.id):
        from actors.multi_agent import multi_agent_specs

        return multi_agent_specs(config)[policy]
    try:
        env = make_env(config)
    except ConfigError:
        raise
    except Exception as error:  # gymnasium raises many kinds for bad kwargs
        raise ConfigError(f"'env.kwargs': cannot make '{config.id}': {error}") from None
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    spec = spec_from_spaces(obs_space, action_space, config.id)
    if config.backend == "envpool":
        from actors.envpool_split import check_envpool

        check_envpool(config, spec)
    return spec


def policy_spec(config: ExperimentConfig, policy: str = DEFAULT_POLICY) -> EnvSpec:
    """What a worker of `policy` needs to know: its env spaces and its recurrent state size."""
    return with_network(env_spec(config.env, policy), config.network)


def check_policies(config: ExperimentConfig) -> None:
    """ConfigError if a policy's spaces or chunks do not fit the network, the learner's
    batch or the servers' batch (checked before launch)."""
    split_envs = config.actors.envs // config.actors.splits
    for policy in policy_names(config.env):
        spec = env_spec(config.env, policy)
        check_network(config.network.kind, spec, config.env.id, config.network.head)
        if spec.action_masked and config.network.head != "actor_critic":
            raise ConfigError(f"'network.head': '{config.network.head}' does not read action "
                              f"masks yet, and policy '{policy}' of '{config.env.id}' has them: "
                              "use an actor_critic head (PPO, IMPALA)")
        columns = split_envs * spec.agents  # (config_checks already refused 1-agent misfits)
        step = columns * config.learner.processes
        frozen = policy in config.selfplay.frozen  # no learner
        if not (config.replay.count or frozen) and config.learner.batch_envs % step:
            raise ConfigError(
                f"'learner.batch_envs' ({config.learner.batch_envs}) must be a multiple of "
                f"{step}: policy '{policy}' sends chunks of {columns} columns ({split_envs} "
                f"envs x {spec.agents} agents) to each of {config.learner.processes} learner "
                "process(es)")
        check_request_rows(config, spec.agents, policy)
    for frozen, source in config.selfplay.opponents.items():
        if _acting_spec(config.env, frozen) != _acting_spec(config.env, source):
            raise ConfigError(f"'selfplay.opponents.{frozen}': policy '{frozen}' cannot play "
                              f"'{source}''s snapshots: their agents' spaces differ")


def _acting_spec(env: EnvConfig, policy: str) -> EnvSpec:
    """What a policy's parameters fit: its spec whatever its number of agents."""
    return dataclasses.replace(env_spec(env, policy), agents=1)


def env_seed(seed: int, actor_index: int, env_index: int) -> int:
    """A distinct, reproducible seed for every environment of every actor."""
    return int(np.random.SeedSequence([seed, actor_index, env_index]).generate_state(1)[0])
