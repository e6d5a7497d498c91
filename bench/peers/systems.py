"""The systems `bench.peers.compare` runs: how each is started, where its progress rows
come from (its own logs) and how it is stopped."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.launcher import stop_process
from bench.harness.machine import config_hash
from bench.harness.run_rows import read_rows
from bench.peers import sample_factory
from srl_jax.dataflow.metrics_table import RETURN_WINDOWS
from srl_jax.runtime.run_dir import read_status

TARGET_RETURN = 475.0
ROLLING_WINDOWS = {f"last{n}": f"episode_return_mean_last{n}" for n in RETURN_WINDOWS}
"""Return window -> the row key of the mean over that many last episodes (srl_jax's
metrics rows and bench.peers.cleanrl_ppo's lines carry them)."""


@dataclass
class Launch:
    """One system's process for one run: how to start it, read it and stop it."""

    command: list[str]
    read: Callable[[Path], list[dict[str, Any]]]
    """Progress rows so far from the run's own logs: `wall` (epoch s), `env_frames`,
    and `return_key` where the system reported one."""
    env: dict[str, str] = field(default_factory=dict)
    stop: Callable[[subprocess.Popen, Path], None] | None = None
    return_key: str = "episode_return_mean"
    """The rows' return that the target is on (`eval_return_mean`: greedy evaluations)."""
    windows: dict[str, str] = field(default_factory=dict)
    """Return window ("last20", "last100") -> the row key of the system's mean over it;
    the run goes on until each of them and `return_key` reached the target."""
    frames: int = 0
    """The env frames the run is to reach (0: none): the harness stops it at the first row
    with as many, and its time to them is a figure. A system that stops itself there,
    short of them by its own granularity (whole updates), says so with a row
    `{"done": "frames"}`."""
    final_keys: tuple[str, ...] = ()
    """Row keys read at the end of the run (at its frames where it has them): the figures
    of a run to equal frames (`episode_return_mean_last100`, `win_rate_last100`)."""


def srl_jax_launch(experiment: str, workdir: Path, overrides: tuple[str, ...],
                   seconds: float, return_key: str = "episode_return_mean",
                   windows: dict[str, str] | None = None, frames: int = 0,
                   final_keys: tuple[str, ...] = ()) -> Launch:
    command = [sys.executable, "-m", "srl_jax.launch", experiment, "--run-dir",
               str(workdir / "run"), "--quiet", "--set", f"stop.wall_time_s={seconds:g}"]
    for override in overrides:
        command += ["--set", override]
    return Launch(command, read_srl_jax, stop=lambda p, d: stop_process(p, d / "run"),
                  return_key=return_key, windows=windows or {}, frames=frames,
                  final_keys=final_keys)


def srl_jax_config(experiment: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """What a case ran of srl_jax, for its results: the config, its file's hash and the
    overrides (besides each round's seed and the budget's wall time)."""
    return {"experiment": experiment, "config_sha256": config_hash(experiment),
            "overrides": list(overrides)}


def read_srl_jax(workdir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, timed from the controller's start in status.json."""
    run_dir = workdir / "run"
    try:
        started = (read_status(run_dir) or {})["started"]
        rows = read_rows(run_dir / "metrics.jsonl")
    except (OSError, ValueError, KeyError):
        return []
    return [{**row, "wall": started + row["time"]} for row in rows]


def cleanrl_launch(workdir: Path, seed: int, seconds: float, baseline: str = "cleanrl_ppo",
                   return_key: str = "episode_return_mean",
                   windows: dict[str, str] | None = None,
                   report_interval_s: float = 1.0, target: float | None = TARGET_RETURN,
                   frames: int = 0, final_keys: tuple[str, ...] = (),
                   extra: tuple[str, ...] = ()) -> Launch:
    """A single-process baseline, `bench.peers.<baseline>`, which prints JSON lines (one
    every `report_interval_s`) and stops itself at `target` (None: never); with `windows`
    it does not: the harness stops it once every window got there. With `frames` it
    stops itself there (`--stop-frames`); `extra`: more of its options."""
    target_arg = "none" if windows or target is None else f"{target:g}"
    command = [sys.executable, "-m", f"bench.peers.{baseline}", "--seed", str(seed),
               "--target-return", target_arg, "--seconds", f"{seconds:g}",
               "--report-interval", f"{report_interval_s:g}",
               *(("--stop-frames", str(frames)) if frames else ()), *extra]
    return Launch(command, read_json_lines, return_key=return_key, windows=windows or {},
                  frames=frames, final_keys=final_keys)


def read_json_lines(workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (workdir / "out.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and "wall" in row and "env_frames" in row:
                rows.append(row)
    return rows


def sample_factory_launch(workdir: Path, seed: int, seconds: float,
                          sampling_only: bool = False) -> Launch:
    python = sample_factory.ensure_venv(sample_factory.DEFAULT_CACHE_DIR)
    command, env = sample_factory.train_command(
        python, workdir / "train_dir", "bench", seed=seed, seconds=seconds,
        sampling_only=sampling_only)
    return Launch(command, lambda d: sample_factory.read_trace(
        (d / "out.log").read_text(errors="replace")), env=env,
        windows={"last100": "episode_return_mean"})  # its --stats_avg of 100 episodes
