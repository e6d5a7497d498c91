"""Recovery times: inject each fault into a live run and time the way back.

    python -m bench.recovery                        # every fault, one run each
    python -m bench.recovery --faults kill:actor-0 stop:learner-0

A fault is `KIND:WORKER`: `kill` (SIGKILL), `stop` (SIGSTOP: frozen; found at
`runtime.heartbeat_timeout_s`, which this sets to --heartbeat-timeout) or
`raise` (the worker raises from its loop, through SRL_JAX_FAULTS). Each runs
the default experiment with no target (so it trains throughout), waits until
it is past its first checkpoint, strikes, and prints two figures: seconds to
the successor running (`running`), and to the first metrics row whose frames/s
is back to 80% of the median before the fault (`throughput`). Results go to
bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.launcher import BenchError, in_workdir, raise_on_sigterm, stop_process
from bench.harness.machine import DEFAULT_EXPERIMENT, REPO_ROOT, config_hash, write_results
from bench.harness.run_rows import read_rows
from srl_jax.runtime.run_dir import read_status

FAULTS = ("kill:actor-0", "kill:inference-0", "kill:learner-0", "stop:actor-0",
          "stop:inference-0", "stop:learner-0", "raise:actor-0", "raise:inference-0",
          "raise:learner-0", "raise:evaluator-0")
BACK_FRACTION = 0.8
SETTLED_ROWS = 8
POLL_S = 0.1


def worker(run_dir: Path, name: str) -> dict[str, Any] | None:
    workers = (read_status(run_dir) or {}).get("workers", [])
    return next((w for w in workers if w["name"] == name), None)


def wait(predicate, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(POLL_S)
    raise BenchError(f"timed out after {timeout:g}s waiting for {what}")


def trained_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Metrics rows since the first checkpoint (start-up and compiling behind)."""
    rows = rows_of(run_dir)
    first = next((i for i, r in enumerate(rows) if r.get("learner/checkpoint_step", 0) > 0),
                 len(rows))
    return rows[first:]


def ready(run_dir: Path) -> bool:
    """Every worker running and 8 metrics rows past the first checkpoint."""
    workers = (read_status(run_dir) or {}).get("workers", [])
    return bool(workers) and all(w["state"] == "running" for w in workers) \
        and len(trained_rows(run_dir)) >= SETTLED_ROWS


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return read_rows(path) if path.exists() else []


def measure(fault: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    kind, name = fault.split(":")
    run_dir = workdir / fault.replace(":", "-")
    faults_dir = workdir / f"{run_dir.name}-faults"
    faults_dir.mkdir()
    if kind == "raise":  # read by the worker once it runs: it raises this long after
        (faults_dir / name).write_text(f"{args.raise_after:g}")
    command = [sys.executable, "-m", "srl_jax.launch", args.experiment, "--run-dir",
               str(run_dir), "--quiet", "--set", "stop.target_return=null",
               "--set", "stop.wall_time_s=900", "--set", "checkpoint.interval_s=2",
               "--set", f"runtime.heartbeat_timeout_s={args.heartbeat_timeout:g}",
               "--set", "actors.inference_timeout_s=1"]
    if name.startswith("evaluator"):
        command += ["--set", "evaluation.every_updates=10", "--set", "evaluation.episodes=2"]
    with (workdir / f"{run_dir.name}.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "SRL_JAX_FAULTS": str(faults_dir)})
    try:
        wait(lambda: ready(run_dir), 180, "a run past its first checkpoint")
        normal = statistics.median(r["fps"] for r in trained_rows(run_dir)[-SETTLED_ROWS:])
        victim = worker(run_dir, name)["pid"]
        if kind == "raise":
            wait(lambda: not (faults_dir / name).exists(), 180, f"{name} to raise")
        else:
            os.kill(victim, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        struck, rows_at_strike = time.monotonic(), len(rows_of(run_dir))
        wait(lambda: (w := worker(run_dir, name)) and w["pid"] != victim
             and w["state"] == "running", 300, f"a running successor of {name}")
        running = time.monotonic() - struck
        wait(lambda: any(r["fps"] >= BACK_FRACTION * normal
                         for r in rows_of(run_dir)[rows_at_strike:]), 120, "throughput back")
        return {"running_s": round(running, 1),
                "throughput_s": round(time.monotonic() - struck, 1), "fps_before": round(normal)}
    finally:
        stop_process(process, run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    parser.add_argument("--faults", nargs="+", default=list(FAULTS), metavar="KIND:WORKER")
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0,
                        help="runtime.heartbeat_timeout_s for the runs (default: 10)")
    parser.add_argument("--raise-after", type=float, default=20.0,
                        help="seconds after its start a 'raise' worker raises (default: 20)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    for fault in args.faults:
        if fault.split(":")[0] not in ("kill", "stop", "raise") or ":" not in fault:
            parser.error(f"fault {fault!r}: expected kill|stop|raise:WORKER")
    signal.signal(signal.SIGTERM, raise_on_sigterm)

    def measure_all(workdir: Path) -> int:
        results: dict[str, Any] = {}
        print(f"{'fault':<20} {'running (s)':>12} {'throughput (s)':>15} {'fps before':>11}")
        for fault in args.faults:
            try:
                result = measure(fault, args, workdir)
            except BenchError as error:
                result = {"error": str(error)}
                print(f"{fault:<20} {error}", flush=True)
            else:
                print(f"{fault:<20} {result['running_s']:>12.1f} {result['throughput_s']:>15.1f}"
                      f" {result['fps_before']:>11,}", flush=True)
            results[fault] = result
        path = write_results("recovery", {"experiment": args.experiment,
                                          "config_sha256": config_hash(args.experiment),
                                          "heartbeat_timeout_s": args.heartbeat_timeout,
                                          "faults": results})
        print(f"results: {path}")
        return 1 if any("error" in r for r in results.values()) else 0

    return in_workdir("srl_recovery_", args.keep, measure_all)


if __name__ == "__main__":
    sys.exit(main())
