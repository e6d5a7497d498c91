"""Runs of the compared systems: one run to its target or budget, its figures from its
progress rows, and rounds of every system in turn."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.machine import REPO_ROOT
from bench.peers import sample_factory
from bench.peers.systems import TARGET_RETURN, Launch

POLL_S = 0.5


@dataclass
class RunFigures:
    startup_s: float | None
    fps: float | None
    frames: int
    wall_s: float
    time_to_target_s: float | None = None
    frames_to_target: int | None = None
    best_return: float | None = None
    windows: dict[str, float | int | None] = field(default_factory=dict)
    """`time_to_target_<window>_s` and `frames_to_target_<window>` of each return window."""

    def figure(self, name: str) -> float | int | None:
        """A figure by name, a window's included (None where the run has no such figure)."""
        return self.windows.get(name) if name in self.windows else getattr(self, name, None)

    def as_dict(self) -> dict[str, Any]:
        flat = {**{k: v for k, v in vars(self).items() if k != "windows"}, **self.windows}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in flat.items()}


def solved_at(rows: list[dict[str, Any]], target: float,
              key: str = "episode_return_mean") -> dict[str, Any] | None:
    return next((r for r in rows if (r.get(key) or -1e30) >= target), None)


def all_solved(rows: list[dict[str, Any]], target: float, keys: list[str]) -> bool:
    """Whether every one of the returns `keys` has reached the target in some row."""
    return all(solved_at(rows, target, key) for key in keys)


def run_once(launch: Launch, workdir: Path, budget_s: float,
             target: float | None) -> RunFigures:
    """Start the system, stop it once its return and each window's reached the target or
    after `budget_s`, and read its figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    launched = time.time()
    with (workdir / "out.log").open("wb") as out:
        process = subprocess.Popen(launch.command, cwd=REPO_ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **launch.env}, start_new_session=True)
    try:
        while process.poll() is None and time.time() - launched < budget_s:
            if target is not None and all_solved(
                    launch.read(workdir), target, [launch.return_key, *launch.windows.values()]):
                break
            time.sleep(POLL_S)
    finally:
        if launch.stop is None:
            sample_factory.stop_group(process)  # Ctrl-C, then the process group
        else:
            launch.stop(process, workdir)
    rows = launch.read(workdir)
    return figures(rows, launched, target, launch.return_key, launch.windows)


def figures(rows: list[dict[str, Any]], launched: float, target: float | None,
            key: str = "episode_return_mean",
            windows: dict[str, str] | None = None) -> RunFigures:
    """Steady fps from the first row with frames to the last; time to target (a row's
    `key` >= target) from launch, and so for each window's key."""
    started = next((r for r in rows if r["env_frames"] > 0), None)
    last = rows[-1] if rows else None
    fps = None
    if started is not None and last["wall"] > started["wall"]:
        fps = (last["env_frames"] - started["env_frames"]) / (last["wall"] - started["wall"])
    returns = [r[key] for r in rows if r.get(key) is not None]
    result = RunFigures(startup_s=started["wall"] - launched if started else None, fps=fps,
                        frames=last["env_frames"] if last else 0,
                        wall_s=(last["wall"] - launched) if last else 0.0,
                        best_return=max(returns) if returns else None)
    if target is None:
        return result
    if hit := solved_at(rows, target, key):
        result.time_to_target_s, result.frames_to_target = hit["wall"] - launched, \
            hit["env_frames"]
    for window, window_key in (windows or {}).items():
        hit = solved_at(rows, target, window_key)
        result.windows[f"time_to_target_{window}_s"] = hit["wall"] - launched if hit else None
        result.windows[f"frames_to_target_{window}"] = hit["env_frames"] if hit else None
    return result


def rounds_of(systems: dict[str, Callable[[Path, int], Launch]], args: argparse.Namespace,
              workdir: Path, budget_s: float, target: float | None) -> dict[str, list[RunFigures]]:
    runs: dict[str, list[RunFigures]] = {name: [] for name in systems}
    for round_index in range(args.rounds):
        for name, make in systems.items():
            seed = round_index + 1
            print(f"  round {round_index + 1}/{args.rounds}: {name} ...", end=" ", flush=True)
            run_dir = workdir / f"{name}-{seed}"
            result = run_once(make(run_dir, seed), run_dir, budget_s, target)
            runs[name].append(result)
            solved = "" if target is None else (
                f", {TARGET_RETURN:g} at {result.time_to_target_s:.1f}s"
                if result.time_to_target_s is not None else ", target not reached")
            fps = f"{result.fps:,.0f} fps" if result.fps else "no frames"
            print(f"{fps}{solved}", flush=True)
    return runs
