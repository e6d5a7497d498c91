"""CartPole whose steps take a fixed time, as a simulator's do: an actor of these steps a
set number of frames a second whatever else runs on the machine, so the run's frames/s
follow how many actors it has (tests/test_ray_backend.py). Small on purpose: actor
processes import it."""

from __future__ import annotations

import os
import time

import gymnasium as gym

PACED_ID = "PacedCartPole-v1"
SMALL_PACED_RUN = ("actors.count=1", "actors.envs=4", "learner.batch_envs=8",
                   "learner.sample_queue=4", f"env.id=tests.paced_env:{PACED_ID}",
                   "env.kwargs={step_s: 0.002}")
"""Overrides for runs that test starting, stopping and restarts, not actors or training:
one small actor of envs whose steps take 2 ms (about 500 frames/s, an update's worth twice
a second) and a learner that holds 4 chunks, so the actor leaves the cores to the workers
starting meanwhile rather than step ahead on them (frames the learner would drop)."""


class PacedCartPole(gym.Wrapper):
    def __init__(self, step_s: float = 0.0002, held_while: str = "",
                 held_step_s: float = 0.05) -> None:
        """`held_while`: a path; while it exists each step takes `held_step_s` (a test holds
        a run short of its frame limit until it has done what it must meanwhile)."""
        super().__init__(gym.make("CartPole-v1"))
        self.step_s = step_s
        self.held_while = held_while
        self.held_step_s = held_step_s

    def step(self, action):
        held = self.held_while and os.path.exists(self.held_while)
        time.sleep(self.held_step_s if held else self.step_s)
        return super().step(action)


if PACED_ID not in gym.envs.registry:
    gym.register(PACED_ID, entry_point=PacedCartPole)
