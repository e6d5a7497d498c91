"""The Atari family: ALE v5 games ('ALE/<Game>-v5') with the DeepMind preprocessing,
uint8 end to end.

The stack, in the order the frames go through it (Mnih et al. 2015; Machado et
al. 2018 for sticky actions):

1. ALE v5 at frame skip 1, with `env.atari.sticky_actions` (v5's 0.25 by
   default) and the minimal action set unless `full_action_space`;
2. gymnasium's `AtariPreprocessing`: up to `noop_max` no-ops after a reset,
   `frame_skip` repeats with the max over the last two frames, 84x84
   grayscale (INTER_AREA), uint8;
3. `EpisodicLife` (optional): a lost life ends the episode for learning (no
   bootstrap across it) while the game goes on; the real game score is still
   what the actor reports, since the ring counts an episode only at game over;
4. `FireReset` for games that need FIRE to start;
5. a stack of the last `frame_stack` frames, channels last: [84, 84, 4] uint8.

Reward clipping is the learner's job (`learner.reward_clip`), so the rewards on
the wire, and the returns in the metrics, are the raw game score.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from actors.env_families.gymnasium_envs import GymnasiumEnvs
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec

if TYPE_CHECKING:
    from ale_py.env import AtariEnv


def ale_game(env: gym.Env) -> AtariEnv:
    """The ALE game under `env`'s wrappers (gymnasium types it as a plain `Env`)."""
    from ale_py.env import AtariEnv  # the Atari extra: imported once a game is made

    game = env.unwrapped
    if not isinstance(game, AtariEnv):
        raise TypeError(f"{env} is not an ALE game")
    return game


class EpisodicLife(gym.Wrapper):
    """A lost life is `terminated` for learning; `reset` then continues the same game.

    `info["game_over"]` says whether the game really ended, for episode accounting.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.ale = ale_game(env).ale
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.ale.lives()
        life_lost = 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated or life_lost, truncated, {**info, "game_over":
                                                                 self.game_over}

    def reset(self, **kwargs: Any) -> tuple:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # a life was lost: a no-op step goes on with the same game
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after a reset, for games that do not start without it."""

    def reset(self, **kwargs: Any) -> tuple:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                return self.env.reset(**kwargs)
        return obs, info


def _channels_last(env: gym.Env) -> gym.Env:
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"stacked frames come as a Box, not as {space}")
    shape = (*space.shape[1:], space.shape[0])
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.moveaxis(np.asarray(obs), 0, -1),
        gym.spaces.Box(0, 255, shape, np.uint8))


def register_atari(env_id: str) -> None:
    """Register the ALE games with gymnasium (quietly); ConfigError without the extra."""
    try:
        import ale_py
    except ImportError:
        raise ConfigError(f"'env.id': '{env_id}' needs the Atari extra: "
                          "pip install 'srl-jax[atari]'") from None
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)


def make_atari(config: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """An ALE game with the preprocessing of `config.atari` (see the module docstring)."""
    register_atari(config.id)
    atari = config.atari
    env = gym.make(config.id, frameskip=1, repeat_action_probability=atari.sticky_actions,
                   full_action_space=atari.full_action_space, render_mode=render_mode,
                   **config.kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=atari.noop_max,
                                          frame_skip=atari.frame_skip, screen_size=84)
    if atari.episodic_life:
        env = EpisodicLife(env)
    if "FIRE" in ale_game(env).get_action_meanings():
        env = FireReset(env)
    env = gym.wrappers.FrameStackObservation(env, atari.frame_stack)
    return _channels_last(env)


class AtariEnvs(GymnasiumEnvs):
    """ALE games through `make_atari`; their observations stack `env.atari.frame_stack`
    frames, which replay stores once each (`EnvSpec.frame_stack`)."""

    def check_id(self, env: EnvConfig) -> None:
        register_atari(env.id)
        super().check_id(env)

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        return dataclasses.replace(super().spec(env, policy), frame_stack=env.atari.frame_stack)

    def make_env(self, env: EnvConfig, render_mode: str | None = None) -> gym.Env:
        if env.mask_obs:
            raise ConfigError("'env.mask_obs' is for vector observations, not Atari frames")
        return make_atari(env, render_mode)


ATARI = AtariEnvs()
