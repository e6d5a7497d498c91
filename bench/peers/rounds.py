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
    time_to_frames_s: float | None = None
    """From launch to the run's frames (`Launch.frames`; None: not reached)."""
    final: dict[str, float] = field(default_factory=dict)
    """Each of `Launch.final_keys` at the run's frames (its last row with the key, up to
    the row that reached them), where the run reported it."""

    def extra(self) -> dict[str, float | int | None]:
        """The window figures and the final ones (`final_<key>`), by name."""
        return {**self.windows, **{f"final_{k}": v for k, v in self.final.items()}}

    def figure(self, name: str) -> float | int | None:
        """A figure by name, a window's and a final one's included (None where the run has
        no such figure)."""
        extra = self.extra()
        return extra[name] if name in extra else getattr(self, name, None)

    def as_dict(self) -> dict[str, Any]:
        flat = {**{k: v for k, v in vars(self).items() if k not in ("windows", "final")},
                **self.extra()}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in flat.items()}


def solved_at(rows: list[dict[str, Any]], target: float,
              key: str = "episode_return_mean") -> dict[str, Any] | None:
    return next((r for r in rows if (r.get(key) or -1e30) >= target), None)


def all_solved(rows: list[dict[str, Any]], target: float, keys: list[str]) -> bool:
    """Whether every one of the returns `keys` has reached the target in some row."""
    return all(solved_at(rows, target, key) for key in keys)


def reached_frames(rows: list[dict[str, Any]], frames: int) -> dict[str, Any] | None:
    """The first row at `frames`, or that says its system stopped itself there."""
    return next((r for r in rows if r["env_frames"] >= frames or r.get("done") == "frames"),
                None)


def run_once(launch: Launch, workdir: Path, budget_s: float,
             target: float | None) -> RunFigures:
    """Start the system, stop it once its return and each window's reached the target, or
    it reached its frames, or after `budget_s`, and read its figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    launched = time.time()
    with (workdir / "out.log").open("wb") as out:
        process = subprocess.Popen(launch.command, cwd=REPO_ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **launch.env}, start_new_session=True)
    try:
        while process.poll() is None and time.time() - launched < budget_s:
            rows = launch.read(workdir)
            if target is not None and all_solved(
                    rows, target, [launch.return_key, *launch.windows.values()]):
                break
            if launch.frames and reached_frames(rows, launch.frames):
                break
            time.sleep(POLL_S)
    finally:
        if launch.stop is None:
            sample_factory.stop_group(process)  # Ctrl-C, then the process group
        else:
            launch.stop(process, workdir)
    rows = launch.read(workdir)
    return figures(rows, launched, target, launch.return_key, launch.windows, launch.frames,
                   launch.final_keys)


def figures(rows: list[dict[str, Any]], launched: float, target: float | None,
            key: str = "episode_return_mean", windows: dict[str, str] | None = None,
            frames: int = 0, final_keys: tuple[str, ...] = ()) -> RunFigures:
    """Steady fps from the first row with frames to the last; time to target (a row's
    `key` >= target) from launch, and so for each window's key; time to `frames` and
    each of `final_keys` there (at the end where the run did not get there)."""
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
    at_frames = reached_frames(rows, frames) if frames else None
    if at_frames is not None:
        result.time_to_frames_s = at_frames["wall"] - launched
    upto = rows[:rows.index(at_frames) + 1] if at_frames is not None else rows
    for final_key in final_keys:
        value = next((r[final_key] for r in reversed(upto) if r.get(final_key) is not None),
                     None)
        if value is not None:
            result.final[final_key] = value
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
            at_frames = "" if result.time_to_frames_s is None else \
                f", its frames at {result.time_to_frames_s:.1f}s"
            print(f"{fps}{solved}{at_frames}", flush=True)
    return runs
