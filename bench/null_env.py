"""A trivially cheap gymnasium environment for runtime benchmarks (bench.scale, bench.overhead).

Registered on import as `NullEnv-v0`; a run selects it with
`--set env.id=bench.null_env:NullEnv-v0` from the repository root (workers start
there, so `bench.null_env` is importable by every process). A step does no
simulation: it hands back the same zero observation, reward 1, and ends the
episode (terminated, never truncated) every `episode_length` steps, so almost
all of an actor's time is the runtime's own work (requests, chunks, sends).

`obs_shape` and `obs_dtype` (env kwargs) set the observation the wire carries,
e.g. `--set 'env.kwargs={obs_shape: [84, 84, 4], obs_dtype: uint8}'` for
Atari-sized frames; the default is CartPole's float32 [4].
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "NullEnv-v0"


class NullEnv(gym.Env):
    """Constant observation, reward 1, an episode of `episode_length` steps, 2 actions."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, obs_shape: tuple[int, ...] | list[int] = (4,),
                 obs_dtype: str = "float32", episode_length: int = 200,
                 render_mode: str | None = None) -> None:
        dtype = np.dtype(obs_dtype)
        high = np.iinfo(dtype).max if dtype.kind in "iu" else 1.0
        self.observation_space = gym.spaces.Box(0, high, tuple(obs_shape), dtype)
        self.action_space = gym.spaces.Discrete(2)
        self.episode_length = int(episode_length)
        self.render_mode = render_mode
        self._obs = np.zeros(self.observation_space.shape, dtype)
        self._t = 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; the observation is always zeros."""
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step: reward 1, terminated after `episode_length` steps."""
        self._t += 1
        return self._obs, 1.0, self._t >= self.episode_length, False, {}


if ENV_ID not in gym.envs.registry:
    gym.register(ENV_ID, entry_point=NullEnv, disable_env_checker=True)
