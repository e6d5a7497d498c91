"""Soak: run an experiment for a long time and watch every process's memory and files.

    python -m bench.soak                    # cartpole_ppo for 30 minutes
    python -m bench.soak --minutes 1.2 --warmup-minutes 0.4   # the short version CI runs
    python -m bench.soak --set checkpoint.interval_s=5   # the learner saving every 5 s

It starts `python -m srl_jax.launch` (the target return is switched off, so the
run trains for the whole time), samples each worker's resident memory (RSS) and
open file descriptors every few seconds from /proc, and prints, per worker, the
figures at the end of the warm-up and at the end with their growth (every
sample is kept in `soak.json` beside the run directory). Each figure is the
lowest of the samples in a `--window` (30 s): a leak raises that floor, while
what a save in flight holds for a moment (its files, its host copy) does not.
It exits 1 if any process grows by more than `--max-growth` (5%) after
warm-up, or if the run itself fails. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.machine import DEFAULT_EXPERIMENT, REPO_ROOT
from srl_jax.runtime.memory import resident_mib
from srl_jax.runtime.run_dir import read_status

FD_SLACK = 4
"""Open files may move by a few (a log rotation, a socket reconnecting) without a leak."""


@dataclass
class Track:
    """One worker's samples: (seconds since start, RSS in MiB, open fds), and its pids."""

    samples: list[tuple[float, float, int]] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def sample(run_dir: Path, tracks: dict[str, Track], elapsed: float) -> None:
    """One sample of every process, while the run runs (not while it shuts down: the
    learner's final checkpoint and closing sockets would read as growth or shrinkage)."""
    status = read_status(run_dir)
    if status is None or status.get("stop_reason") is not None:
        return
    pids = {"controller": status["controller_pid"]}
    pids.update({w["name"]: w["pid"] for w in status["workers"] if w.get("pid")})
    for name, pid in pids.items():
        rss, fds = resident_mib(pid), open_fds(pid)
        if rss is not None and fds is not None:
            track = tracks.setdefault(name, Track())
            track.samples.append((elapsed, rss, fds))
            track.pids.add(pid)


def growth(track: Track, warmup_s: float,
           window_s: float) -> tuple[float, float, int, int] | None:
    """(RSS after warm-up, RSS at the end, fds after warm-up, fds at the end), each the
    lowest in the first and the last `window_s` after warm-up."""
    after = [s for s in track.samples if s[0] >= warmup_s]
    if len(after) < 2:
        return None
    warm = [s for s in after if s[0] <= after[0][0] + window_s]
    end = [s for s in after if s[0] >= after[-1][0] - window_s]
    return (min(s[1] for s in warm), min(s[1] for s in end),
            min(s[2] for s in warm), min(s[2] for s in end))


def report(tracks: dict[str, Track], warmup_s: float, window_s: float,
           max_growth: float) -> list[str]:
    """Print the table; return the processes that grew too much."""
    print(f"{'process':<14}{'RSS start':>11}{'RSS warm':>10}{'RSS end':>10}{'growth':>9}"
          f"{'fds warm':>10}{'fds end':>9}  pids")
    grown = []
    for name, track in tracks.items():
        figures = growth(track, warmup_s, window_s)
        if figures is None:
            print(f"{name:<14}  (too few samples after warm-up)")
            continue
        warm_rss, end_rss, warm_fds, end_fds = figures
        rate = end_rss / warm_rss - 1
        restarted = " (restarted)" if len(track.pids) > 1 else ""
        print(f"{name:<14}{track.samples[0][1]:>9.1f}M{warm_rss:>9.1f}M{end_rss:>9.1f}M"
              f"{rate:>+8.1%}{warm_fds:>10}{end_fds:>9}  {len(track.pids)}{restarted}")
        if rate > max_growth or end_fds > warm_fds + FD_SLACK:
            grown.append(name)
    return grown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="ignored for growth (default: a fifth of the run, at most 5)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds whose lowest sample is each figure (30)")
    parser.add_argument("--max-growth", type=float, default=0.05,
                        help="largest RSS growth after warm-up, as a fraction (0.05)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="extra config override; repeatable")
    args = parser.parse_args(argv)
    duration = args.minutes * 60
    warmup = 60 * (args.warmup_minutes if args.warmup_minutes is not None
                   else min(args.minutes / 5, 5.0))
    run_dir = Path(tempfile.mkdtemp(prefix="srl_jax_soak_")) / "run"
    command = [sys.executable, "-m", "srl_jax.launch", args.experiment, "--run-dir",
               str(run_dir), "--quiet", "--set", "stop.target_return=null",
               "--set", f"stop.wall_time_s={duration:g}"]
    for override in args.overrides:
        command += ["--set", override]
    print(f"soak: {args.experiment} for {args.minutes:g} min (warm-up {warmup / 60:.1f} min), "
          f"sampling every {args.every:g}s; run directory {run_dir}", flush=True)
    tracks: dict[str, Track] = {}
    start = time.monotonic()
    with open(run_dir.parent / "launch.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                elapsed = time.monotonic() - start
                if elapsed < duration:  # the run starts later, so this ends before its stop
                    sample(run_dir, tracks, elapsed)
                time.sleep(args.every)
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=180)
    samples = {name: track.samples for name, track in tracks.items()}
    (run_dir.parent / "soak.json").write_text(json.dumps(samples))
    grown = report(tracks, warmup, args.window, args.max_growth)
    if process.returncode != 0:
        print(f"soak: the run failed (exit {process.returncode}); see "
              f"{run_dir.parent / 'launch.log'}")
        return 1
    if grown:
        print(f"soak: grew more than {args.max_growth:.0%} after warm-up: {', '.join(grown)}")
        return 1
    print(f"soak: no process grew more than {args.max_growth:.0%} after warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
