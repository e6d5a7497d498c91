"""bench.peers.compare's reading of a run: the time and frames to the target by each window."""

from __future__ import annotations

from typing import Any

from bench.peers.rounds import RunFigures, all_solved, figures
from bench.peers.summary import RATIO_FIGURES, ratio_rounds
from bench.peers.systems import ROLLING_WINDOWS


def test_each_window_has_its_own_time_and_frames_to_the_target() -> None:
    rows = [{"wall": 101.0, "env_frames": 0},
            {"wall": 102.0, "env_frames": 1000, "episode_return_mean": 480.0,
             "episode_return_mean_last20": 300.0, "episode_return_mean_last100": 120.0},
            {"wall": 103.0, "env_frames": 2000, "episode_return_mean": 400.0,
             "episode_return_mean_last20": 476.0, "episode_return_mean_last100": 300.0},
            {"wall": 104.0, "env_frames": 3000, "episode_return_mean": 500.0,
             "episode_return_mean_last20": 490.0, "episode_return_mean_last100": 475.0}]
    run = figures(rows, 100.0, 475.0, windows=ROLLING_WINDOWS)
    assert (run.time_to_target_s, run.frames_to_target) == (2.0, 1000)  # a lucky row
    flat = run.as_dict()
    assert flat["time_to_target_last20_s"] == 3.0 and flat["frames_to_target_last20"] == 2000
    assert flat["time_to_target_last100_s"] == 4.0 and flat["frames_to_target_last100"] == 3000
    short = figures(rows[:3], 100.0, 475.0, windows=ROLLING_WINDOWS)
    assert short.figure("time_to_target_last100_s") is None  # not reached: no figure
    assert not all_solved(rows[:3], 475.0, list(ROLLING_WINDOWS.values()))
    assert all_solved(rows, 475.0, list(ROLLING_WINDOWS.values()))


def test_ratios_pair_the_same_window_on_both_sides() -> None:
    def run(time_s: float, last20: float | None) -> Any:
        figures = RunFigures(startup_s=1.0, fps=1.0, frames=1, wall_s=1.0,
                                     time_to_target_s=time_s)
        figures.windows = {"time_to_target_last20_s": last20}
        return figures

    runs = {"srl_jax": [run(10.0, 12.0), run(10.0, None)],
            "cleanrl_ppo": [run(20.0, 30.0), run(20.0, 30.0)]}
    assert ratio_rounds(runs, "srl_jax", "cleanrl_ppo",
                                "time_to_target_last20_s") == [0.4]  # round 2 did not get there
    assert RATIO_FIGURES["time_to_target_last20_s"] == "time_to_475_last20_ratio"
