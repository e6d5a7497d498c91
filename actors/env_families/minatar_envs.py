"""The MinAtar family: 'minatar:<game>', the five games of Young & Tian (2019) stepped by
the paper's own numpy implementation (the `minatar` package), so its actors need no JAX.

- Observations: the paper's channels, [10, 10, C] with C from the game (4 for Breakout,
  7 for Freeway, 10 for Seaquest), 0 or 1 as uint8: a quarter of float32's bytes on the
  wire and in replay. The MLP casts them to float32 as they are (no /255: that is the
  Nature-CNN's, for 0..255 frames, and its 8x8/4 layer does not fit 10x10 anyway).
- Actions: the game's minimal set (3 for Breakout, 6 for Seaquest), as gymnax's MinAtar and
  the PPO results published on it (PureJaxRL) have them; `full_action_space: true` gives
  all 6, as the paper's DQN had them.
- `env.kwargs` (`KWARGS`): the paper's sticky actions (0.1) and difficulty ramping (on) by
  default, and a time limit (`max_episode_steps`, gymnax's: 1000 steps, 2500 for Freeway,
  where the game itself ends) that truncates: a Breakout player that never misses would
  otherwise never finish an episode.
"""

from __future__ import annotations

import colorsys
import difflib
import importlib
import importlib.util
import logging
import sys
from typing import Any

import gymnasium as gym
import numpy as np

from actors.env_families.gymnasium_envs import GymnasiumEnvs, mask_observations
from srl_jax.config.schema import ConfigError, EnvConfig

GAMES = {"asterix": 1000, "breakout": 1000, "freeway": 2500, "seaquest": 1000,
         "space_invaders": 1000}
"""The games, each with its default time limit in steps (gymnax's `max_steps_in_episode`)."""
KWARGS: dict[str, Any] = {"sticky_action_prob": 0.1, "difficulty_ramping": True,
                          "full_action_space": False, "max_episode_steps": None}
"""The `env.kwargs` a MinAtar env takes, with their defaults (None: the game's in `GAMES`)."""
CELL = 16
"""Pixels a side of one grid cell in rendered frames."""


def minatar_environment() -> type:
    """`minatar.Environment` (the MinAtar extra), imported without the plotting packages
    its module imports for its human display, which this family never opens: matplotlib
    and seaborn cost about 4 CPU-seconds in every actor and test process."""
    absent = [name for name in ("matplotlib", "seaborn") if name not in sys.modules]
    for name in absent:
        sys.modules[name] = None  # type: ignore[assignment]  # importing it fails at once
    disabled = logging.root.manager.disable
    logging.disable(max(disabled, logging.WARNING))  # minatar's warning that it cannot plot
    try:
        minatar = importlib.import_module("minatar")
    finally:
        logging.disable(disabled)
        for name in absent:
            del sys.modules[name]
    return minatar.Environment


class MinAtarEnv(gym.Env):
    """One MinAtar game as a gymnasium env (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, game: str, sticky_action_prob: float = 0.1,
                 difficulty_ramping: bool = True, full_action_space: bool = False,
                 max_episode_steps: int | None = None, render_mode: str | None = None) -> None:
        environment = minatar_environment()
        self.game = environment(game, sticky_action_prob=sticky_action_prob,
                                difficulty_ramping=difficulty_ramping)
        self.actions = list(range(self.game.num_actions())) if full_action_space \
            else self.game.minimal_action_set()
        self.max_episode_steps = max_episode_steps or GAMES[game]
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self.observation_space = gym.spaces.Box(0, 1, self.game.state_shape(), np.uint8)
        self.steps = 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """A new game; with `seed`, the game's and the sticky actions' random state starts
        again from it, so the same seed and actions give the same episode."""
        super().reset(seed=seed)
        if seed is not None:
            self.game.seed(seed)
        self.game.last_action = 0  # minatar keeps the last action (stickiness) across games
        self.game.reset()
        self.steps = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward, terminated = self.game.act(self.actions[int(action)])
        self.steps += 1
        truncated = not terminated and self.steps >= self.max_episode_steps
        return self._obs(), float(reward), bool(terminated), truncated, {}

    def render(self) -> np.ndarray | None:
        """An RGB frame: each cell in the colour of its highest set channel, black if none."""
        if self.render_mode != "rgb_array":
            return None
        state = self.game.state()
        channels = state.shape[-1]
        palette = np.array([(0.0, 0.0, 0.0)] + [colorsys.hsv_to_rgb(c / channels, 0.7, 1.0)
                                                for c in range(channels)])
        top = np.max(state * np.arange(1, channels + 1), axis=-1)
        frame = (palette[top] * 255).astype(np.uint8)
        return frame.repeat(CELL, axis=0).repeat(CELL, axis=1)

    def _obs(self) -> np.ndarray:
        return self.game.state().view(np.uint8)  # bool and uint8 share their bytes


def game_of(env_id: str) -> str:
    """The game of 'minatar:<game>'; a one-line ConfigError naming `env.id` otherwise."""
    game = env_id.partition(":")[2]
    if game not in GAMES:
        close = difflib.get_close_matches(game, list(GAMES), n=1)
        hint = f" (did you mean 'minatar:{close[0]}'?)" if close else ""
        raise ConfigError(f"'env.id': unknown MinAtar game '{game}'{hint}; the games are "
                          + ", ".join(GAMES))
    return game


def game_kwargs(env: EnvConfig) -> dict[str, Any]:
    """`env.kwargs` over `KWARGS`' defaults, checked; a ConfigError names the bad key."""
    for key in env.kwargs:
        if key not in KWARGS:
            close = difflib.get_close_matches(key, list(KWARGS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"'env.kwargs.{key}': not a MinAtar option{hint}; the options "
                              "are " + ", ".join(KWARGS))
    kwargs = {**KWARGS, **env.kwargs}
    sticky, limit = kwargs["sticky_action_prob"], kwargs["max_episode_steps"]
    if isinstance(sticky, bool) or not isinstance(sticky, int | float) or not 0 <= sticky <= 1:
        raise ConfigError(f"'env.kwargs.sticky_action_prob': a probability in [0, 1], "
                          f"not {sticky!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise ConfigError(f"'env.kwargs.max_episode_steps': a positive number of steps, "
                          f"not {limit!r}")
    for key in ("difficulty_ramping", "full_action_space"):
        if not isinstance(kwargs[key], bool):
            raise ConfigError(f"'env.kwargs.{key}': true or false, not {kwargs[key]!r}")
    return kwargs


class MinAtarEnvs(GymnasiumEnvs):
    """MinAtar games through `MinAtarEnv`; the spec and the splits are the gymnasium
    family's."""

    def check_id(self, env: EnvConfig) -> None:
        game_of(env.id)
        game_kwargs(env)
        if importlib.util.find_spec("minatar") is None:  # not imported: minatar_environment
            raise ConfigError(f"'env.id': '{env.id}' needs the MinAtar extra: "
                              "pip install 'srl-jax[minatar]'")

    def make_env(self, env: EnvConfig, render_mode: str | None = None) -> gym.Env:
        self.check_id(env)
        made = MinAtarEnv(game_of(env.id), **game_kwargs(env), render_mode=render_mode)
        return mask_observations(made, env.mask_obs) if env.mask_obs else made


MINATAR = MinAtarEnvs()
