"""What carrying a recurrent state costs: env frames/s of `cartpole_lstm_ppo` beside the
same config with `network.core=none`, in one invocation.

Each pair of runs is the recurrent config and then its feed-forward twin, for
``--seconds`` each with ``stop.target_return=null`` (so both run the whole
time), ``--pairs`` times, alternating so that both see the same machine. The
steady frames/s of each run come from its metrics exactly as in `bench.e2e_fps`
(start-up left out). It prints each run, the medians and the ratio recurrent /
feed-forward, and the bytes a request row and a chunk column carry with and
without the state (from the chunk spec), which is the state's cost on the wire.

    .venv/bin/python -m bench.recurrent_fps                 # 3 pairs of 30 s
    .venv/bin/python -m bench.recurrent_fps --pairs 5 --seconds 60 --set network.core=gru

Every process this script starts is stopped by its pid on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from actors.envs import policy_spec
from bench.harness.launcher import BenchError, busy_warning, raise_on_sigterm, run_experiment
from bench.harness.machine import nproc
from bench.harness.run_rows import RunResult, read_rows, steady_figures
from srl_jax.config.loader import config_dirs, load_config, resolve_experiment_path
from srl_jax.dataflow.chunk_spec import chunk_layout

EXPERIMENT = "cartpole_lstm_ppo"
FEED_FORWARD = "network.core=none"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recurrent_fps",
        description="Env frames/s of a recurrent config beside its feed-forward twin.")
    parser.add_argument("--pairs", type=int, default=3, help="run pairs (default: 3)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="wall time of each run, start-up included (default: 30)")
    parser.add_argument("--experiment", default=EXPERIMENT,
                        help=f"a config with a recurrent core (default: {EXPERIMENT})")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override for both runs of a pair; repeatable")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.seconds <= 0:
        parser.error("--pairs must be at least 1 and --seconds positive")
    return args


def wire_bytes(experiment: str, overrides: list[str]) -> dict[str, tuple[int, int]]:
    """(bytes without the state, bytes of the state) of one request row and of one chunk
    column of the experiment, as the chunk spec lays them out."""
    config = load_config(resolve_experiment_path(experiment, config_dirs()), overrides)
    spec = policy_spec(config)
    layout = chunk_layout(config.actors.trajectory_length, 1, spec)
    sizes = {name: int(np.prod(shape)) * dtype.itemsize for name, (shape, dtype) in layout.items()}
    obs_row = int(np.prod(spec.obs_shape)) * spec.obs_dtype.itemsize
    # A chunk column stores one state: exactly what one request row carries.
    return {"request row": (obs_row, sizes["state"]),
            "chunk column": (sum(sizes.values()) - sizes["state"], sizes["state"])}


def run_pair(args: argparse.Namespace, workdir: Path, index: int) -> list[RunResult]:
    """The recurrent run, then its feed-forward twin; BenchError if either fails."""
    results = []
    for label, extra in (("recurrent", []), ("none", [FEED_FORWARD])):
        run_args = argparse.Namespace(experiment=args.experiment, seconds=args.seconds,
                                      overrides=[*args.overrides, *extra])
        run_dir, log = workdir / f"{label}{index}", workdir / f"{label}{index}.log"
        print(f"pair {index}/{args.pairs}: {label} for {args.seconds:g}s ...", flush=True)
        code = run_experiment(run_args, run_dir, log)
        if code != 0:
            raise BenchError(f"{label} run {index}: launcher exited with code {code} "
                             f"(log: {log})")
        results.append(steady_figures(index, read_rows(run_dir / "metrics.jsonl")))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    load_at_start = busy_warning()
    wire = wire_bytes(args.experiment, args.overrides)
    workdir = Path(tempfile.mkdtemp(prefix="srl_recurrent_fps_"))
    recurrent, feed_forward = [], []
    try:
        for index in range(1, args.pairs + 1):
            with_state, without = run_pair(args, workdir, index)
            recurrent.append(with_state.fps)
            feed_forward.append(without.fps)
            print(f"  recurrent {with_state.fps:,.0f} | none {without.fps:,.0f} env frames/s | "
                  f"ratio {with_state.fps / without.fps:.2f}", flush=True)
    except BenchError as error:
        print(f"failed: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    median_r, median_n = statistics.median(recurrent), statistics.median(feed_forward)
    pair_ratio = statistics.median(r / n for r, n in zip(recurrent, feed_forward, strict=True))
    print()
    print(f"experiment {args.experiment}" + (f", --set {' '.join(args.overrides)}"
                                             if args.overrides else "")
          + f": {args.pairs} pair(s) of {args.seconds:g}s runs, alternating")
    print(f"median env frames/s: recurrent {median_r:,.0f} | none {median_n:,.0f} | "
          f"ratio of the medians {median_r / median_n:.2f} | median of the pairs' ratios "
          f"{pair_ratio:.2f}")
    for what, (plain, state) in wire.items():
        print(f"wire bytes per {what}: {plain:,} without the state + {state:,} of state "
              f"({(plain + state) / plain:.1f}x)")
    print(f"machine: nproc {nproc()} ({platform.processor() or platform.machine()})"
          + (f"; {load_at_start}" if load_at_start else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
