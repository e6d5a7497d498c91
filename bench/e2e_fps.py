"""End-to-end throughput of the default experiment, against the raw env stepping rate.

What it measures
----------------
1. **e2e fps**: it runs the default experiment (`python -m srl_jax.launch
   cartpole_ppo`) ``--runs`` times as a subprocess, each in a fresh temporary run
   directory, with ``stop.target_return=null`` and ``stop.wall_time_s=--seconds``
   so that every run lasts the same time and measures steady throughput rather
   than time-to-solve. From each run's ``metrics.jsonl`` it takes the steady
   env-frames-per-second: (env_frames at the last row - env_frames at the first
   row with env_frames > 0) / (time between those rows). Start-up (imports, jit
   compilation, workers connecting) is left out and reported on its own: as the
   time of the first row with env_frames > 0 (``startup_s``, to a 1 s row), and as
   ``first_frame_s``, seconds from the launcher's start to the first env frame an
   actor reported (``status.json``'s ``startup``, to a controller loop turn). It also
   averages the time-split
   fractions the workers report (actor env/wait/send, inference compute,
   learner update) and the inference batch size over the steady rows, which
   tell where the time goes.
2. **raw env steps/s**: one Python process, no sockets, no policy, steps as many
   environments as the experiment's whole ring (actors.count * actors.envs from
   the resolved ``config.yaml``) in a loop with random actions, resetting each
   finished one by hand, the way an actor's env ring does. Median of 3 short
   measurements, about ``--raw-seconds`` in all, taken after the runs so the
   machine is otherwise idle.

Why
---
The ratio ``e2e fps / raw env steps/s`` says how much of the bare simulator
speed the distributed system delivers. On a small machine the actors, the
inference server and the learner share a few cores, so the ratio is well below
1; it rises with more cores (several actor processes can step in parallel, so
it can exceed 1). A drop in the ratio on the same machine means overhead was
added somewhere in the dataflow (wire format, streams, batching, the ring).

Run from the repository root::

    .venv/bin/python bench/e2e_fps.py --runs 3 --seconds 30 [--set actors.count=4 ...]

Every process this script starts is stopped by its pid on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's srl_jax
from machine import nproc

from srl_jax.config.run_dir import read_status

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EXPERIMENT = "cartpole_ppo"
STOP_GRACE_S = 20.0
"""How long the launcher gets to stop its workers after SIGTERM before it is killed."""
RUN_TIMEOUT_MARGIN_S = 180.0
"""Allowed on top of --seconds for start-up and shutdown before a run counts as hung."""
RAW_REPEATS = 3

SPLIT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("env", "actor/time_env_frac"),
    ("wait", "actor/time_wait_frac"),
    ("send", "actor/time_send_frac"),
    ("infer", "inference/time_compute_frac"),
    ("update", "learner/time_update_frac"),
    ("batch", "inference/batch_rows_mean"),
)
"""(table header, metrics key): mean over the steady rows of each run."""


class BenchError(RuntimeError):
    """A run that produced no usable figures."""


@dataclass
class RunResult:
    index: int
    startup_s: float
    steady_s: float
    steady_frames: int
    fps: float
    splits: dict[str, float] = field(default_factory=dict)
    first_frame_s: float = math.nan
    """From the launcher's start to the first env frame (status.json `startup`)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/e2e_fps.py",
        description="Steady end-to-end env frames/s of an srl_jax experiment, compared with "
                    "the raw single-process env stepping rate on this machine.",
        epilog="Figures printed at the end are medians over the runs (and over 3 raw "
               "measurements).")
    parser.add_argument("--runs", type=int, default=3, help="experiment runs (default: 3)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="wall time of each run, start-up included (default: 30)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="extra config override passed to the launcher; repeatable")
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                        help=f"config name or path (default: {DEFAULT_EXPERIMENT})")
    parser.add_argument("--raw-seconds", type=float, default=5.0,
                        help="total time of the raw env stepping measurement (default: 5)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run directories and print where they are")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.seconds <= 0 or args.raw_seconds <= 0:
        parser.error("--seconds and --raw-seconds must be positive")
    return args


def raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# ---------------------------------------------------------------- processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_worker_of(pid: int, run_dir: Path) -> bool:
    """Whether `pid` is still an srl_jax worker of `run_dir` (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "srl_jax.worker" in cmdline and str(run_dir) in cmdline


def _leftover_workers(run_dir: Path) -> list[int]:
    """Worker pids from `status.json` that still run as workers of this run directory."""
    status = read_status(run_dir) or {}
    pids = [w.get("pid") for w in status.get("workers", [])]
    return [p for p in pids if isinstance(p, int) and _alive(p) and is_worker_of(p, run_dir)]


def stop_process(process: subprocess.Popen[bytes], run_dir: Path) -> None:
    """SIGTERM the launcher (it stops its workers), SIGKILL it after a grace period.

    The launcher runs in its own session, so a Ctrl-C here does not reach it; it
    is stopped only through its pid. Workers it leaves behind (only if it had to
    be killed) are looked up by pid in the run's `status.json` and killed too.
    """
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=STOP_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            process.kill()
            process.wait()
    deadline = time.monotonic() + 5.0
    while (leftover := _leftover_workers(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)  # workers stop by themselves once their controller is gone
    for pid in leftover:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_experiment(args: argparse.Namespace, run_dir: Path, log_path: Path) -> int:
    """One launcher run to its wall-time limit; returns its exit code."""
    command = [sys.executable, "-m", "srl_jax.launch", args.experiment,
               "--run-dir", str(run_dir), "--quiet",
               "--set", "stop.target_return=null",
               "--set", f"stop.wall_time_s={args.seconds:g}"]
    for override in args.overrides:
        command += ["--set", override]
    return run_launcher(command, run_dir, log_path, args.seconds + RUN_TIMEOUT_MARGIN_S)


def run_launcher(command: list[str], run_dir: Path, log_path: Path, timeout_s: float) -> int:
    """Run a launcher command in its own session, logging to `log_path`; its exit code.
    BenchError past `timeout_s`; the launcher and its workers are stopped by pid either way."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"did not finish within {timeout_s:.0f}s") from None
        finally:
            stop_process(process, run_dir)


# ------------------------------------------------------------------ metrics


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(row, dict) and "time" in row and "env_frames" in row:
            rows.append(row)
    return rows


def read_first_frame_s(run_dir: Path) -> float:
    """Seconds from the launcher's start to the run's first env frame, from status.json
    (NaN when the run did not record it)."""
    value = ((read_status(run_dir) or {}).get("startup") or {}).get("first_frame_s")
    return float(value) if isinstance(value, int | float) else math.nan


def steady_figures(index: int, rows: list[dict[str, Any]]) -> RunResult:
    """Steady fps and time splits: from the first row with env_frames > 0 to the last row."""
    start = next((i for i, row in enumerate(rows) if row["env_frames"] > 0), None)
    if start is None:
        raise BenchError("no env frames were recorded; is --seconds long enough for start-up?")
    first, last = rows[start], rows[-1]
    span = last["time"] - first["time"]
    if span <= 0:
        raise BenchError(f"no steady window after a start-up of {first['time']:.1f}s; "
                         "raise --seconds")
    frames = last["env_frames"] - first["env_frames"]
    steady = rows[start + 1:]
    splits = {}
    for name, key in SPLIT_COLUMNS:
        values = [row[key] for row in steady if isinstance(row.get(key), (int, float))]
        splits[name] = statistics.fmean(values) if values else math.nan
    return RunResult(index, first["time"], span, frames, frames / span, splits)


# ---------------------------------------------------------------- raw envs


def raw_env_rates(env: dict[str, Any], num_envs: int, total_s: float,
                  repeats: int = RAW_REPEATS, seed: int = 0) -> list[float]:
    """Steps/s of `num_envs` environments stepped in one loop: `repeats` measurements."""
    import numpy as np

    from actors.envs import make_env
    from srl_jax.config.loader import config_from_dict

    config = config_from_dict({"env": env}).env  # all of it: Atari preprocessing included
    envs = [make_env(config) for _ in range(num_envs)]
    try:
        for i, e in enumerate(envs):
            e.reset(seed=seed + i)
        num_actions = int(envs[0].action_space.n)
        rng = np.random.default_rng(seed)

        def measure(seconds: float) -> float:
            steps, started = 0, time.perf_counter()
            deadline = started + seconds
            while (now := time.perf_counter()) < deadline or steps == 0:
                actions = rng.integers(num_actions, size=num_envs)
                for e, action in zip(envs, actions.tolist(), strict=True):
                    _, _, terminated, truncated, _ = e.step(action)
                    if terminated or truncated:
                        e.reset()
                steps += num_envs
            return steps / (now - started)

        measure(min(0.2, total_s / 10))  # warm-up
        return [measure(total_s / repeats) for _ in range(repeats)]
    finally:
        for e in envs:
            e.close()


# ------------------------------------------------------------------ output


def busy_warning() -> str | None:
    """A warning when the machine is already busy (figures would come out low), else None."""
    if not hasattr(os, "getloadavg"):
        return None
    load = os.getloadavg()[0]
    if load < 0.5 * nproc():
        return None
    message = f"WARNING: 1-min load average was {load:.1f} at start: the machine was busy"
    print(message, flush=True)
    return message


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def print_table(results: list[RunResult]) -> None:
    header = (f"{'run':>3}  {'first_frame_s':>13}  {'startup_s':>9}  {'steady_s':>8}  "
              f"{'frames':>10}  "
              f"{'e2e_fps':>9}  " + "  ".join(f"{name:>6}" for name, _ in SPLIT_COLUMNS))
    print(header)
    print("-" * len(header))
    for r in results:
        splits = "  ".join(f"{_fmt(r.splits[name], '.1f' if name == 'batch' else '.3f'):>6}"
                           for name, _ in SPLIT_COLUMNS)
        print(f"{r.index:>3}  {_fmt(r.first_frame_s, '.2f'):>13}  {r.startup_s:>9.1f}  "
              f"{r.steady_s:>8.1f}  "
              f"{r.steady_frames:>10,}  {r.fps:>9,.0f}  {splits}")
    print("columns env/wait/send: actor time fractions; infer: inference compute fraction; "
          "update: learner update fraction; batch: mean inference batch rows (steady rows)")


# -------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    load_at_start = busy_warning()
    workdir = Path(tempfile.mkdtemp(prefix="srl_e2e_fps_"))
    results: list[RunResult] = []
    failures = 0
    resolved: dict[str, Any] | None = None
    try:
        for index in range(1, args.runs + 1):
            run_dir = workdir / f"run{index}"
            log_path = workdir / f"run{index}.log"
            print(f"run {index}/{args.runs}: {args.experiment} for {args.seconds:g}s ...",
                  flush=True)
            try:
                code = run_experiment(args, run_dir, log_path)
                if code != 0:
                    raise BenchError(f"launcher exited with code {code}")
                result = steady_figures(index, read_rows(run_dir / "metrics.jsonl"))
                result.first_frame_s = read_first_frame_s(run_dir)
                results.append(result)
                if resolved is None:
                    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
            except (BenchError, OSError) as error:
                failures += 1
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:] \
                    if log_path.exists() else []
                print(f"run {index} failed: {error}", file=sys.stderr)
                for line in tail:
                    print(f"  | {line}", file=sys.stderr)
        if not results or resolved is None:
            print("no run produced figures", file=sys.stderr)
            return 1

        num_envs = int(resolved["actors"]["count"]) * int(resolved["actors"]["envs"])
        print(f"raw env stepping: {num_envs} x {resolved['env']['id']} in one process "
              f"for ~{args.raw_seconds:g}s ...", flush=True)
        raw = raw_env_rates(resolved["env"], num_envs, args.raw_seconds, seed=0)

        print()
        print(f"experiment {args.experiment}: {resolved['actors']['count']} actors x "
              f"{resolved['actors']['envs']} envs, {args.seconds:g}s per run"
              + (f", --set {' '.join(args.overrides)}" if args.overrides else ""))
        print_table(results)
        print(f"raw env steps/s ({num_envs} envs, one process): "
              + ", ".join(f"{r:,.0f}" for r in raw))
        print()
        e2e, raw_median = statistics.median(r.fps for r in results), statistics.median(raw)
        startup = statistics.median(r.startup_s for r in results)
        first = statistics.median(r.first_frame_s for r in results)
        print(f"median e2e fps {e2e:,.0f} | raw env steps/s {raw_median:,.0f} | "
              f"ratio {e2e / raw_median:.2f} | start-up {startup:.1f}s | first frame "
              f"{_fmt(first, '.2f')}s")
        print(f"machine: nproc {nproc()} ({platform.processor() or platform.machine()}); "
              f"figures are medians of {len(results)} run(s) and {len(raw)} raw measurements"
              + (f"; {load_at_start}" if load_at_start else ""))
        if args.keep:
            print(f"run directories kept in {workdir}")
        return 1 if failures else 0
    except KeyboardInterrupt:
        print("interrupted" + (f"; run directories kept in {workdir}" if args.keep else ""),
              file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
