"""The start-up timeline keeps the first time of each step; restarts do not move it."""

from __future__ import annotations

import time

from srl_jax.runtime.worker_records import StartupTimeline


def test_each_step_keeps_its_first_time_counted_from_the_launch() -> None:
    timeline = StartupTimeline(time.time() - 2.0)
    timeline.mark("actor-0", "spawned")
    timeline.mark("actor-0", "heard")
    time.sleep(0.01)
    timeline.mark("actor-0", "spawned")  # a restart
    timeline.first("env_frames")
    first = timeline.first_frame_s
    time.sleep(0.01)
    timeline.first("env_frames")
    assert timeline.to_json()["first_update_s"] is None
    timeline.first("learner_steps")
    started = timeline.to_json()
    steps = started["workers"]["actor-0"]
    assert 2.0 <= started["controller_s"] <= steps["spawned_s"] <= steps["heard_s"] < 3.0
    assert started["first_frame_s"] == first >= steps["heard_s"]
    assert started["first_update_s"] >= first
    assert "running_s" not in steps
