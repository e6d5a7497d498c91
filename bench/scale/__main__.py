"""`python -m bench.scale`: the overheads, the sweep and what they imply (the package's
docstring says what is measured)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness.launcher import (
    BenchError,
    busy_warning,
    raise_on_sigterm,
    release_workdir,
)
from bench.harness.machine import (
    DEFAULT_EXPERIMENT,
    REPO_ROOT,
    config_hash,
    nproc,
    write_results,
)
from bench.overhead.cases import BATCH_CHUNKS, IN_FLIGHT, NULL_ENV, TRAJECTORY
from bench.overhead.measure import measure_overheads
from bench.overhead.summary import print_overheads
from bench.scale.summary import (
    headline,
    mark_saturation,
    plain,
    print_headline,
    print_saturation,
    print_sweep,
)
from bench.scale.sweep import Point, run_sweep, sweep_overrides
from srl_jax.config.schema import ActorConfig, request_rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="Scaling sweep: throughput of the real system against actor and "
                    "inference server counts on this machine, with the runtime's overhead per "
                    "inference request and per sample (bench.overhead).",
        epilog="Defaults finish in under 5 minutes on 2 cores; --quick in about 1 minute.")
    parser.add_argument("--quick", action="store_true",
                        help="actors 1 4 16, one server, shorter windows (under a minute)")
    parser.add_argument("--actors", type=int, nargs="+", default=None, metavar="A",
                        help="actor counts of the sweep (default: 1 2 4 8 16)")
    parser.add_argument("--servers", type=int, nargs="+", default=None, metavar="N",
                        help="inference server counts of the sweep (default: 1 2)")
    parser.add_argument("--envs", type=int, default=16,
                        help="envs per actor, K: rows per request with one split (default: 16)")
    parser.add_argument("--splits", type=int, default=1,
                        help="inference splits per actor (default: 1: with a free env step "
                             "there is nothing to overlap)")
    parser.add_argument("--max-batch", type=int, default=128,
                        help="inference.max_batch of the sweep (default: 128)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before each sweep point's window (default: 2; quick 1.5)")
    parser.add_argument("--window", type=float, default=None,
                        help="seconds each sweep point is measured (default: 8; quick 4)")
    parser.add_argument("--micro-seconds", type=float, default=None,
                        help="seconds of each overhead measurement (default: 1.5; quick 0.6)")
    parser.add_argument("--budget", type=float, default=270.0,
                        help="seconds after which no sweep point is started (default: 270)")
    parser.add_argument("--env", default=NULL_ENV,
                        help=f"env.id of the sweep (default: {NULL_ENV})")
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                        help=f"base config of the sweep (default: {DEFAULT_EXPERIMENT})")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="extra override for the sweep; repeatable")
    parser.add_argument("--skip-overheads", action="store_true",
                        help="sweep only (bench.overhead gives the overheads alone)")
    parser.add_argument("--no-results", action="store_true",
                        help="do not write bench/results/scale.json")
    parser.add_argument("--keep", action="store_true", help="keep the sweep's run directories")
    args = parser.parse_args(argv)
    quick = args.quick
    args.actors = sorted(set(args.actors or ([1, 4, 16] if quick else [1, 2, 4, 8, 16])))
    args.servers = sorted(set(args.servers or ([1] if quick else [1, 2])))
    args.warmup = args.warmup if args.warmup is not None else (1.5 if quick else 2.0)
    args.window = args.window if args.window is not None else (4.0 if quick else 8.0)
    args.micro_seconds = args.micro_seconds if args.micro_seconds is not None else (
        0.6 if quick else 1.5)
    if min(args.actors) < 1 or min(args.servers) < 1:
        parser.error("actor and server counts must be at least 1")
    if args.envs < 1 or args.splits < 1 or args.envs % args.splits:
        parser.error("--envs must be a positive multiple of --splits")
    if args.max_batch < (rows := request_rows(ActorConfig(envs=args.envs, splits=args.splits))):
        parser.error(f"--max-batch must hold the {rows} rows of one request (twice --envs / "
                     f"--splits: the final observations of episodes a time limit ends)")
    if args.window <= 0 or args.warmup < 0 or args.micro_seconds <= 0:
        parser.error("--window and --micro-seconds must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    began = time.monotonic()
    load_warning = busy_warning()
    load_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="srl_scale_"))
    overheads: dict[str, Any] | None = None
    points: list[Point] = []
    startups: dict[str, float] = {}
    failures: list[str] = []
    try:
        if not args.skip_overheads:
            print(f"overheads: {args.micro_seconds:g}s per measurement ...", flush=True)
            try:
                overheads = measure_overheads(args.envs, args.micro_seconds)
            except BenchError as error:
                failures.append(f"overheads: {error}")
        points, startups = run_sweep(args, workdir, began + args.budget, failures)
        saturation = mark_saturation(points) if points else {}
        head = headline(overheads, points)
        print()
        if overheads:
            print_overheads(overheads)
            print()
        if points:
            print_sweep(points)
            print_saturation(saturation)
            print()
        if head:
            print_headline(head, args.envs)
        wall, load_end = time.monotonic() - began, os.getloadavg()[0]
        print(f"machine: nproc {nproc()}; load average {load_start:.1f} at start, "
              f"{load_end:.1f} at end; {wall:.0f}s in all"
              + (" (figures from a busy machine are low and noisy)" if load_warning else ""))
        for failure in failures:
            print(f"not measured: {failure}", file=sys.stderr)
        if not args.no_results and (overheads or points):
            path = write_results("scale", plain({
                **head,
                "settings": {
                    "env": args.env, "experiment": args.experiment,
                    "config_sha256": config_hash(args.experiment), "envs_per_actor": args.envs,
                    "splits": args.splits, "trajectory_length": TRAJECTORY,
                    "learner_batch_envs": args.envs // args.splits * BATCH_CHUNKS,
                    "max_batch": args.max_batch, "requests_in_flight": IN_FLIGHT,
                    "warmup_s": args.warmup, "window_s": args.window,
                    "micro_seconds": args.micro_seconds, "quick": args.quick,
                    "launch_overrides": {str(n): sweep_overrides(args, n, max(args.actors))
                                         for n in args.servers},
                },
                "overheads": overheads, "sweep": [asdict(p) for p in points],
                "saturation": saturation, "startup_s": startups, "not_measured": failures,
                "wall_s": wall,
                "load_avg_1m_start": load_start, "load_avg_1m_end": load_end,
            }))
            print(f"results: {path.relative_to(REPO_ROOT)}")
        return 1 if failures else 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        release_workdir(workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
