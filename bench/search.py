"""MuZero's acting cost: search simulations per second per server core, and a run's figures.

What it measures
----------------
1. **Per core.** The inference server's jitted call for `cartpole_muzero` (a batched
   Gumbel MuZero search through the model, `learner.muzero.simulations` each), in a
   child process pinned to one core, on batches of ``--rows`` observations padded as the
   server pads them: rows/s and simulations/s (rows times simulations), median over
   ``--repeats`` timings of ``--calls`` calls each, after compiling.
2. **The run.** `cartpole_muzero` for ``--seconds`` with its target off, so it runs the
   whole time: steady env frames/s (as `bench.e2e_fps` reads them), and the medians of
   its rows' `inference/simulations_per_s`, `inference/search_depth_mean`,
   `replay/reanalysed_per_s` and the inference server's busy fraction; simulations per
   second of the server's compute is the rate over that fraction.

Results go to `bench/results/search.json`.

    .venv/bin/python -m bench.search
    .venv/bin/python -m bench.search --seconds 120 --rows 16 64 256

Every process this script starts is stopped by its pid on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.launcher import (
    BenchError,
    busy_warning,
    in_workdir,
    raise_on_sigterm,
    run_experiment,
)
from bench.harness.machine import write_results
from bench.harness.run_rows import read_rows, steady_figures

EXPERIMENT = "cartpole_muzero"
RUN_ROWS = ("inference/simulations_per_s", "inference/search_depth_mean",
            "replay/reanalysed_per_s", "inference/time_compute_frac")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.search",
        description="Search simulations per second per server core, and a MuZero run's rates.")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256],
                        help="batch sizes of the per-core search (default: 16 64 256)")
    parser.add_argument("--calls", type=int, default=20, help="calls per timing (default: 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per size (default: 5)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="wall time of the run, start-up included (default: 60)")
    parser.add_argument("--per-core", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def per_core(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """In this process, pinned to one core: the server's search rate at each batch size."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["JAX_PLATFORMS"] = "cpu"
    import numpy as np

    from actors.envs import policy_spec
    from policy.acting import make_runner
    from srl_jax.config.loader import config_dirs, load_config, resolve_experiment_path
    from srl_jax.dataflow.algorithms import algorithm_config

    config = load_config(resolve_experiment_path(EXPERIMENT, config_dirs()))
    spec = policy_spec(config)
    simulations = algorithm_config(config).simulations
    rng = np.random.default_rng(0)
    figures = {}
    for rows in args.rows:
        runner = make_runner(config, spec, 0, rows, rows)
        runner.compile()
        obs = rng.normal(size=(rows, *spec.obs_shape)).astype(np.float32)
        state = runner.zero_state(rows)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.calls):
                runner.run(obs, state)
            times.append((time.perf_counter() - start) / args.calls)
        rows_per_s = rows / statistics.median(times)
        figures[str(rows)] = {"rows_per_s": rows_per_s,
                              "simulations_per_s": rows_per_s * simulations}
    return figures


def measure_per_core(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    command = [sys.executable, "-m", "bench.search", "--per-core", "--rows",
               *map(str, args.rows), "--calls", str(args.calls), "--repeats", str(args.repeats)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise BenchError(f"the per-core search failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    run_args = argparse.Namespace(experiment=EXPERIMENT, seconds=args.seconds,
                                  overrides=[])
    run_dir, log = workdir / "run", workdir / "run.log"
    code = run_experiment(run_args, run_dir, log)
    if code != 0:
        raise BenchError(f"the run exited {code}; see {log}")
    rows = read_rows(run_dir / "metrics.jsonl")
    figures = {"env_frames_per_s": steady_figures(0, rows).fps}
    for key in RUN_ROWS:
        values = [row[key] for row in rows if row.get(key)]
        figures[key] = statistics.median(values) if values else 0.0
    busy = figures["inference/time_compute_frac"]
    figures["simulations_per_compute_s"] = (figures["inference/simulations_per_s"] / busy
                                            if busy else 0.0)
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.per_core:
        print(json.dumps(per_core(args)))
        return 0
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    warning = busy_warning()

    def body(workdir: Path) -> int:
        core = measure_per_core(args)
        print("per core: " + ", ".join(
            f"{rows} rows {f['simulations_per_s']:,.0f} simulations/s" for rows, f in core.items()))
        run = measure_run(args, workdir)
        print(f"{EXPERIMENT}, {args.seconds:g}s: {run['env_frames_per_s']:,.0f} env frames/s, "
              f"{run['inference/simulations_per_s']:,.0f} simulations/s "
              f"({run['simulations_per_compute_s']:,.0f} per second of server compute), search "
              f"depth {run['inference/search_depth_mean']:.2f}, reanalysed "
              f"{run['replay/reanalysed_per_s']:,.0f} steps/s")
        path = write_results("search", {"warning": warning, "per_core": core, "run": run,
                                        "run_seconds": args.seconds})
        print(f"wrote {path}")
        return 0

    try:
        return in_workdir("srl_search_", False, body)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
