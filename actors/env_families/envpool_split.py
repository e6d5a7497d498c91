"""EnvPool: a split stepped as one C++ batch, with the interface and chunks of `EnvSplit`.

The 'envpool' backend of the gymnasium, Atari and MuJoCo families
(`srl_jax/config/env_families.py`). With `env.backend: envpool` each actor split is one
`envpool.make(...)` pool of n environments (extra `[envpool]`). Ids map as 'ALE/Pong-v5'
-> 'Pong-v5' (EnvPool's own Atari, with the options of `env.atari`: no-op starts, frame
skip with max-pool, 84x84 grayscale, frame stack, episodic life, sticky
actions, FIRE reset; rewards unclipped), the rest by name ('CartPole-v1',
'HalfCheetah-v5'). Observations get the gymnasium stack's layout: image stacks
channels last, float64 as float32, so the chunks have the gymnasium ring's
fields, shapes and dtypes; `check_envpool` refuses a task whose spaces differ.
Values differ where EnvPool's own generator draws random starts or its own ALE
build renders frames; from one state CartPole and HalfCheetah step alike
(tests/test_envpool.py).

EnvPool resets a finished env on that env's *next* step. The ring needs the
new episode's first observation at once (see `actors/env_ring.py`), so the
finished envs are stepped once more on their own (`env_id`), which is that
reset. With episodic life, EnvPool's `info["terminated"]` marks the real game
over, and only then is an episode counted, so returns are whole-game scores.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from actors.env_families.implementation import EnvFamilyImplementation, implementation_of
from actors.env_ring import OnePolicy, StepResult
from srl_jax.config.schema import DEFAULT_BACKEND, ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec

ALE_NAMESPACE = "ALE/"
"""What EnvPool's names of ALE games leave out."""


def envpool_task(env_id: str, atari: bool = False) -> str:
    return env_id.removeprefix(ALE_NAMESPACE) if atari else env_id


def make_pool(config: EnvConfig, num_envs: int, seed: int, atari: bool = False) -> Any:
    """An EnvPool of `num_envs` envs of `config` (gymnasium API, synchronous); `atari`:
    EnvPool's ALE with the preprocessing of `config.atari`."""
    try:
        import envpool
    except ImportError:
        raise ConfigError("'env.backend': 'envpool' needs the EnvPool extra: "
                          "pip install 'srl-jax[envpool]'") from None
    task = envpool_task(config.id, atari)
    if task not in envpool.list_all_envs():
        raise ConfigError(f"'env.backend': EnvPool has no task '{task}' (for env.id "
                          f"'{config.id}')")
    kwargs = dict(config.kwargs)
    if atari:
        ale = config.atari
        if ale.noop_max < 1:  # EnvPool draws from 0 .. noop_max-1: 0 crashes the process
            raise ConfigError("'env.atari.noop_max': EnvPool's Atari needs at least 1 (it "
                              f"makes up to noop_max reset no-ops), got {ale.noop_max}")
        kwargs.update(noop_max=ale.noop_max, frame_skip=ale.frame_skip,
                      stack_num=ale.frame_stack, episodic_life=ale.episodic_life,
                      repeat_action_probability=ale.sticky_actions,
                      full_action_space=ale.full_action_space, reward_clip=False,
                      img_height=84, img_width=84, gray_scale=True, use_fire_reset=True)
    # One thread: an actor is one process stepping one split at a time; parallelism comes
    # from many actors, and a pool of threads per split only fights them for cores.
    return envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=seed,
                        num_threads=1, **kwargs)


def to_ring_layout(obs: np.ndarray) -> np.ndarray:
    """EnvPool's [N, C, H, W] frame stacks as [N, H, W, C]; float64 as float32."""
    if obs.ndim == 4:
        return np.ascontiguousarray(np.moveaxis(obs, 1, -1))
    return obs.astype(np.float32) if obs.dtype == np.float64 else obs


def check_envpool(config: EnvConfig, spec: EnvSpec, atari: bool = False) -> None:
    """ConfigError unless EnvPool's version of the env has the gymnasium stack's spaces."""
    pool = make_pool(config, 1, 0, atari)
    obs, _ = pool.reset()
    obs = to_ring_layout(obs)
    actions = pool.action_space
    pool.close()
    dim = actions.shape[0] if spec.continuous else int(getattr(actions, "n", -1))
    if obs.shape[1:] != spec.obs_shape or obs.dtype != spec.obs_dtype or dim != spec.action_dim:
        raise ConfigError(f"'env.backend': EnvPool's '{envpool_task(config.id, atari)}' observes "
                          f"{obs.dtype}{list(obs.shape[1:])} with {dim} actions, where the "
                          f"gymnasium env has {spec.obs_dtype}{list(spec.obs_shape)} with "
                          f"{spec.action_dim}")


class EnvPoolSplit:
    """One split as one EnvPool batch (see the module docstring)."""

    def __init__(self, config: EnvConfig, num_envs: int, seed: int, atari: bool = False) -> None:
        # EnvPool takes int32 seeds and seeds its env i with seed + i.
        self.pool = make_pool(config, num_envs, seed % (2**31 - num_envs), atari)
        self.n = num_envs
        self.all_envs = np.arange(num_envs, dtype=np.int32)
        self.episodic_life = atari and config.atari.episodic_life
        obs, info = self.pool.reset()
        self.obs = to_ring_layout(obs)[np.argsort(info["env_id"])]
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)

    def __len__(self) -> int:
        return self.n

    def step(self, actions: list) -> StepResult:
        obs, rewards, terminated, truncated, info = self.pool.step(np.asarray(actions),
                                                                   self.all_envs)
        order = np.argsort(info["env_id"])
        obs, rewards = to_ring_layout(obs)[order], np.asarray(rewards, np.float32)[order]
        terminated, truncated = terminated[order], truncated[order] & ~terminated[order]
        game_over = (info["terminated"][order].astype(bool) | truncated) if self.episodic_life \
            else terminated | truncated
        self.returns += rewards
        self.lengths += 1
        truncated_envs = np.flatnonzero(truncated)
        final_obs = obs[truncated_envs].copy()
        finished = np.flatnonzero(game_over)
        returns = [float(r) for r in self.returns[finished]]
        lengths = [int(n) for n in self.lengths[finished]]
        self.returns[finished], self.lengths[finished] = 0.0, 0
        done = np.flatnonzero(terminated | truncated)
        if len(done):  # EnvPool's reset of a finished env is that env's next step
            zero = np.zeros((len(done), *np.asarray(actions).shape[1:]),
                            np.asarray(actions).dtype)
            reset_obs, *_, reset_info = self.pool.step(zero, done.astype(np.int32))
            obs[reset_info["env_id"]] = to_ring_layout(reset_obs)
        self.obs = obs
        return StepResult(rewards, terminated, truncated, obs, truncated_envs.astype(np.int64),
                          final_obs, returns, lengths)

    def close(self) -> None:
        self.pool.close()


class EnvPoolEnvs(EnvFamilyImplementation):
    """The 'envpool' backend of a family whose default backend makes the same envs with
    gymnasium: ids, spaces and single envs come from that one, splits from EnvPool."""

    def __init__(self, atari: bool = False) -> None:
        self.atari = atari
        """Whether its ids are ALE games (EnvPool's own Atari, see the module docstring)."""

    def check_id(self, env: EnvConfig) -> None:
        _gymnasium(env).check_id(env)

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        spec = _gymnasium(env).spec(env, policy)
        check_envpool(env, spec, self.atari)
        return spec

    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> OnePolicy:
        return OnePolicy(EnvPoolSplit(env, count, seeds[0], self.atari))  # seeds seeds[0] + i

    def make_env(self, env: EnvConfig, render_mode: str | None = None) -> Any:
        return _gymnasium(env).make_env(env, render_mode)


def _gymnasium(env: EnvConfig) -> EnvFamilyImplementation:
    """The implementation of `env`'s family with the default backend."""
    return implementation_of(dataclasses.replace(env, backend=DEFAULT_BACKEND))


ENVPOOL = EnvPoolEnvs()
ENVPOOL_ATARI = EnvPoolEnvs(atari=True)
