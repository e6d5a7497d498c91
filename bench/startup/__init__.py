"""Start-up of a run: how long from the command to the first env frame and the first update,
and what starting a JAX worker costs.

What it measures
----------------
Each case runs `python -m srl_jax.launch EXPERIMENT` ``--runs`` times, each in a fresh run
directory, stops it (by pid) once its metrics show ``--updates`` learner updates, and
reads:

- ``launch_to_first_frame_s`` / ``launch_to_first_update_s``: seconds from the launcher's
  start (the command, a little before the controller's: ``startup.controller_s``) to the
  first env frame an actor reported and to the learner's first update (status.json's
  ``startup``: ``first_frame_s``, ``first_update_s``);
- ``jax_worker_start_cpu_s``: the CPU-seconds each JAX worker (learner, inference server,
  evaluator, replay server) spent from its process's start to running (its log's
  ``set up in`` line: from its fork where the warm parent forked it, from the interpreter's
  start where it started fresh), the median over the run's JAX workers;
- ``warm_parent_cpu_s``: the CPU-seconds the warm parent spent on its imports (its log's
  ``imported in`` line; 0 where no warm parent ran).

Each figure is the median over the runs. The cases: the default experiment with a warm
compilation cache (the top level of the JSON: a first, unmeasured run fills the cache),
then an Atari config (warm cache), then the default experiment with a cold cache (an empty
cache directory for each run).

Run from the repository root::

    .venv/bin/python -m bench.startup --runs 5 --json bench/results/startup.json

Every process this script starts is stopped by its pid on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.launcher import (
    BenchError,
    busy_warning,
    in_workdir,
    raise_on_sigterm,
    stop_process,
)
from bench.harness.machine import DEFAULT_EXPERIMENT, REPO_ROOT, describe, git_commit
from bench.harness.run_rows import read_rows
from srl_jax.dataflow.worker_kinds import KINDS
from srl_jax.runtime.hosts.warm_parent import IMPORTED
from srl_jax.runtime.run_dir import read_status
from srl_jax.runtime.worker_base import SET_UP

ATARI_EXPERIMENT = "atari_pong_impala"
FIGURES = ("launch_to_first_frame_s", "launch_to_first_update_s", "jax_worker_start_cpu_s",
           "warm_parent_cpu_s")
RUN_TIMEOUT_S = 300.0
CPU_LINE = r"{} ([0-9.]+) CPU-s"


def cpu_seconds(log: Path, marker: str) -> float | None:
    """The CPU-seconds a worker's or warm parent's log line (`marker`) states, its first."""
    if not log.exists():
        return None
    found = re.search(CPU_LINE.format(re.escape(marker)), log.read_text(errors="replace"))
    return float(found.group(1)) if found else None


def run_figures(run_dir: Path) -> dict[str, float]:
    """One finished run's figures, from its status.json and logs."""
    startup = read_status(run_dir)["startup"]
    if startup.get("first_update_s") is None:
        raise BenchError(f"{run_dir}: no update was reported")
    warm_kinds = tuple(f"{kind.name}-" for kind in KINDS.values() if kind.warm)
    starts = [cpu for name in startup["workers"] if name.startswith(warm_kinds)
              if (cpu := cpu_seconds(run_dir / "logs" / f"{name}.log", SET_UP)) is not None]
    if not starts:
        raise BenchError(f"{run_dir}: no JAX worker logged its start-up")
    parent = cpu_seconds(run_dir / "logs" / "warm_parent.log", IMPORTED)
    return {"launch_to_first_frame_s": startup["first_frame_s"],
            "launch_to_first_update_s": startup["first_update_s"],
            "jax_worker_start_cpu_s": statistics.median(starts),
            "warm_parent_cpu_s": parent or 0.0}


def updates_done(run_dir: Path) -> int:
    """The learner steps of the run's last metrics row (0 before its first)."""
    path = run_dir / "metrics.jsonl"
    rows = read_rows(path) if path.exists() else []
    return int(rows[-1].get("learner_steps", 0)) if rows else 0


def run_to_updates(command: list[str], run_dir: Path, log_path: Path, updates: int) -> None:
    """Run the launcher until its learner has made `updates` updates, then stop it (by pid)."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while updates_done(run_dir) < updates:
                if process.poll() is not None:
                    raise BenchError(f"the run exited with {process.returncode} before "
                                     f"{updates} updates; see {log_path}")
                if time.monotonic() > deadline:
                    raise BenchError(f"no {updates} updates in {RUN_TIMEOUT_S:.0f}s; see "
                                     f"{log_path}")
                time.sleep(0.2)
        finally:
            stop_process(process, run_dir)


def run_case(workdir: Path, name: str, experiment: str, runs: int, updates: int,
             cold: bool, overrides: list[str]) -> dict[str, Any]:
    """`runs` runs of `experiment` to `updates` updates; each figure's median and values."""
    cache = workdir / "cache"
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for index in range(runs + (0 if cold else 1)):
        run_dir = workdir / f"{name}-{index}"
        cache_dir = workdir / f"cold-{index}" if cold else cache
        command = [sys.executable, "-m", "srl_jax.launch", experiment, "--run-dir",
                   str(run_dir), "--quiet", "--set", "stop.target_return=null",
                   "--set", f"runtime.compilation_cache_dir={cache_dir}"]
        for override in overrides:
            command += ["--set", override]
        run_to_updates(command, run_dir, workdir / f"{name}-{index}.log", updates)
        if index == 0 and not cold:
            continue  # it filled the compilation cache
        results.append(run_figures(run_dir))
        print(f"  {name} run {len(results)}: " + "  ".join(
            f"{key} {value:.2f}" for key, value in results[-1].items()), flush=True)
    return {**{key: round(statistics.median(r[key] for r in results), 3) for key in FIGURES},
            "runs": results, "experiment": experiment, "compilation_cache": (
                "cold" if cold else "warm"), "overrides": overrides}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--updates", type=int, default=3,
                        help="each run stops after this many learner updates")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--cases", default="default,atari,cold",
                        help="which of default, atari, cold to run (comma-separated)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override for every run")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    cases = {"default": (DEFAULT_EXPERIMENT, False), "atari": (ATARI_EXPERIMENT, False),
             "cold": (DEFAULT_EXPERIMENT, True)}
    chosen = [case for case in args.cases.split(",") if case]
    if unknown := [case for case in chosen if case not in cases]:
        parser.error(f"unknown case(s) {', '.join(unknown)} (known: {', '.join(cases)})")

    def body(workdir: Path) -> int:
        warning = busy_warning()
        figures: dict[str, Any] = {}
        for case in chosen:
            experiment, cold = cases[case]
            print(f"{case}: {experiment}, {'cold' if cold else 'warm'} compilation cache",
                  flush=True)
            figures[case] = run_case(workdir / case, case, experiment, args.runs,
                                     args.updates, cold, args.overrides)
            print(f"{case} (median of {args.runs}): " + "  ".join(
                f"{key} {figures[case][key]:.2f}" for key in FIGURES), flush=True)
        if args.json is not None:
            document = {**figures.get("default", {}), "cases": figures,
                        "commit": git_commit(), "machine": describe(), "warning": warning}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(document, indent=2) + "\n")
            print(f"wrote {args.json}")
        return 0

    try:
        return in_workdir("srl_jax_startup_", args.keep, body)
    except BenchError as error:
        print(f"bench.startup: {error}", file=sys.stderr)
        return 1
