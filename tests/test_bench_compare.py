"""bench.peers.compare's reading of a run: the time and frames to the target by each window."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench.peers import compare
from bench.peers.rounds import RunFigures, all_solved, figures
from bench.peers.summary import RATIO_FIGURES, ratio_rounds
from bench.peers.systems import ROLLING_WINDOWS
from srl_jax.config.loader import load_config

REPO = Path(__file__).resolve().parents[1]


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


def test_the_cartpole_case_reads_both_sides_at_the_same_row_interval(
        monkeypatch: Any, tmp_path: Path) -> None:
    captured: dict[str, Any] = {}

    def capture(args: Any, workdir: Path, systems: dict, *rest: Any) -> dict[str, Any]:
        captured.update(systems)
        return {}

    monkeypatch.setattr(compare, "target_case", capture)
    result = compare.case_cartpole(argparse.Namespace(budget=30.0), tmp_path)
    assert result["row_interval_s"] == compare.ROW_INTERVAL_S
    ours = captured["srl_jax"](tmp_path / "srl", 3).command
    baseline = captured["cleanrl_ppo"](tmp_path / "cleanrl", 3).command
    interval = f"{compare.ROW_INTERVAL_S:g}"
    overrides = [ours[i + 1] for i, word in enumerate(ours) if word == "--set"]
    config = load_config(REPO / "configs" / "cartpole_ppo.yaml", overrides)  # valid overrides
    assert config.runtime.log_interval_s == config.runtime.stats_interval_s \
        == compare.ROW_INTERVAL_S
    assert baseline[baseline.index("--report-interval") + 1] == interval


def test_a_run_to_equal_frames_reads_its_time_and_final_figures_at_the_frames() -> None:
    ours = [{"wall": 101.0, "env_frames": 0},
            {"wall": 102.0, "env_frames": 900, "win_rate_last100": 0.5},
            {"wall": 103.0, "env_frames": 1010, "win_rate_last100": 0.75},
            {"wall": 105.0, "env_frames": 1200, "win_rate_last100": 0.9}]  # past them
    run = figures(ours, 100.0, None, frames=1000, final_keys=("win_rate_last100", "absent"))
    assert run.time_to_frames_s == 3.0 and run.final == {"win_rate_last100": 0.75}
    assert run.as_dict()["final_win_rate_last100"] == 0.75
    assert run.figure("final_win_rate_last100") == 0.75 and run.figure("final_absent") is None
    # a baseline stops itself at its last whole update, short of the frames, and says so
    baseline = [{"wall": 101.0, "env_frames": 500, "win_rate_last100": 0.25},
                {"wall": 102.0, "env_frames": 992, "win_rate_last100": 0.5},
                {"wall": 102.1, "env_frames": 992, "done": "frames"}]
    run = figures(baseline, 100.0, None, frames=1000, final_keys=("win_rate_last100",))
    assert run.time_to_frames_s == pytest.approx(2.1) and run.final["win_rate_last100"] == 0.5
    stopped = [*baseline[:2], {"wall": 900.0, "env_frames": 992, "done": "seconds"}]
    assert figures(stopped, 100.0, None, frames=1000).time_to_frames_s is None


def test_the_minatar_case_runs_the_config_as_shipped_and_the_baseline_to_the_same_frames(
        monkeypatch: Any, tmp_path: Path) -> None:
    launches: dict[str, Any] = {}

    def rounds(systems: dict, args: Any, workdir: Path, budget_s: float,
               target: float | None) -> dict[str, list[RunFigures]]:
        assert (budget_s, target) == (compare.BUDGETS_S["minatar"], None)
        launches.update({name: make(tmp_path / name, 2) for name, make in systems.items()})

        def run(fps: float, time_s: float, final: float) -> RunFigures:
            return RunFigures(startup_s=5.0, fps=fps, frames=3000, wall_s=time_s,
                              time_to_frames_s=time_s,
                              final={"episode_return_mean_last100": final})
        return {"srl_jax": [run(4000.0, 760.0, 30.0)] * 3,
                "purejaxrl_ppo": [run(2000.0, 1520.0, 20.0)] * 3}

    monkeypatch.setattr(compare, "rounds_of", rounds)
    args = argparse.Namespace(budget=None, rounds=3, minatar_frames=3000)
    result = compare.case_minatar(args, tmp_path)
    ours, baseline = launches["srl_jax"], launches["purejaxrl_ppo"]
    assert ours.frames == baseline.frames == 3000
    overrides = [ours.command[i + 1] for i, word in enumerate(ours.command) if word == "--set"]
    config = load_config(REPO / "configs" / "minatar_breakout_ppo.yaml", overrides)
    assert config.stop.env_frames == 10_000_000  # the step size anneals over the shipped run
    command = baseline.command
    assert command[command.index("--stop-frames") + 1] == "3000"
    assert command[command.index("--total-frames") + 1] == "10000000"  # annealed alike
    assert command[command.index("--target-return") + 1] == "none"
    assert result["fps_ratio_vs_purejaxrl_ppo"] == 2.0
    assert result["time_to_frames_ratio_vs_purejaxrl_ppo"] == 0.5
    assert result["final_episode_return_mean_last100_ratio_vs_purejaxrl_ppo"] == 1.5
    assert result["systems"]["srl_jax"]["reached"] == 3
