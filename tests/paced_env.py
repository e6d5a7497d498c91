"""CartPole whose steps take a fixed time, as a simulator's do: an actor of these steps a
set number of frames a second whatever else runs on the machine, so the run's frames/s
follow how many actors it has (tests/test_ray_backend.py). Small on purpose: actor
processes import it."""

from __future__ import annotations

import time

import gymnasium as gym

PACED_ID = "PacedCartPole-v1"


class PacedCartPole(gym.Wrapper):
    def __init__(self, step_s: float = 0.0002) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.step_s = step_s

    def step(self, action):
        time.sleep(self.step_s)
        return super().step(action)


if PACED_ID not in gym.envs.registry:
    gym.register(PACED_ID, entry_point=PacedCartPole)
