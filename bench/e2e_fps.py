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

    .venv/bin/python -m bench.e2e_fps --runs 3 --seconds 30 [--set actors.count=4 ...]

Every process this script starts is stopped by its pid on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.harness.launcher import BenchError, busy_warning, raise_on_sigterm, run_experiment
from bench.harness.machine import DEFAULT_EXPERIMENT, nproc
from bench.harness.raw_stepping import raw_env_rates
from bench.harness.run_rows import (
    SPLIT_COLUMNS,
    RunResult,
    read_first_frame_s,
    read_rows,
    steady_figures,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.e2e_fps",
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


# ------------------------------------------------------------------ output


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
