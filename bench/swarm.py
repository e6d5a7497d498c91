"""The control plane at thousands of workers, on one small machine: the real controller
and name service, and simulated workers on simulated hosts.

What it measures
----------------
It starts the controller (bench/simulated/swarm_controller.py: the real `Controller` with the
network name service, its metrics rows and status.json every second, its supervisor),
whose launch backend puts `--workers` simulated workers on `--hosts` simulated hosts
(bench/simulated/swarm_hosts.py): per host a real host agent (srl_jax/runtime/hosts/host_agent.py),
per worker real sockets and the real control messages at the real rates (config,
lookups, registers, a heartbeat with its kind's counters every
`runtime.stats_interval_s`, episode returns, log lines), and no data at all. Once
every worker has reported running it measures for `--seconds`:

- `controller_cpu_cores`: the controller process's CPU time over the window, in cores;
- `name_requests_per_s`: requests its name service answered, per second;
- `heartbeat_age_p50_s`, `heartbeat_age_p99_s`: the age of the newest heartbeat the
  controller holds for each worker (status.json's `last_heartbeat` against its
  `updated`), over every worker in every status.json read in the window;
- `missed_heartbeats`: of those, the ages above 3 heartbeat periods;
- `lookup_p99_ms`: a `get` each simulated worker times at its host agent every 10 s;
- `worker_exits`: workers that exited or were killed (the controller's restarts);
- `startup_s`: from the controller's start until every worker reported running.

The simulated hosts share the machine with the controller (`simulator_cpu_cores`:
what they used, agents included): where they need most of it, the controller gets
what is left and the ages include the simulator's own lateness (`sim_late_beats`
counts the heartbeats it sent more than a period late).

Run from the repository root::

    .venv/bin/python -m bench.swarm --workers 10000 --hosts 100 --seconds 60

Results go to `bench/results/swarm.json` (`--json PATH` elsewhere), with the commit and
the machine. Every process it starts is stopped by its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.launcher import BenchError, busy_warning, raise_on_sigterm, release_workdir
from bench.harness.machine import REPO_ROOT, RESULTS_DIR, git_commit, nproc, write_results
from bench.simulated.swarm_hosts import HEARTBEAT_S
from srl_jax.runtime.run_dir import read_metrics, read_status

STARTUP_TIMEOUT_S = 600.0
SAMPLE_S = 1.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=0,
                        help="host processes (0: one per 1,000 workers, at least 2)")
    parser.add_argument("--simulate", choices=("workers", "agents"), default="workers",
                        help="workers: each simulated worker sends its heartbeats on a socket "
                        "of its own to its host's agent; agents: hands them to the agent in "
                        "its process (what reaches the controller is the same)")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default bench/results/swarm.json)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="a config override for the controller (key=value)")
    args = parser.parse_args(argv)
    if args.hosts < 1 or args.workers < 3 or args.seconds <= 0:
        parser.error("--hosts must be at least 1, --workers at least 3, --seconds positive")
    args.processes = args.processes or max(2, min(args.hosts, args.workers // 1000))
    return args


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_results(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def children(pid: int) -> list[int]:
    """The processes `pid` started (the host processes, for the controller)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_running(process: subprocess.Popen, run_dir: Path, workers: int) -> float:
    """Seconds until status.json shows every worker running."""
    started = time.monotonic()
    shown = -1
    while time.monotonic() - started < STARTUP_TIMEOUT_S:
        if process.poll() is not None:
            raise BenchError(f"the controller exited with {process.returncode}; see "
                             f"{run_dir / 'logs'}")
        status = read_status(run_dir) or {}
        running = sum(w.get("state") == "running" for w in status.get("workers", []))
        if running != shown:
            shown = running
            print(f"\rstarting: {running}/{workers} workers running", end="", flush=True)
        if running == workers:
            print()
            return time.monotonic() - started
        time.sleep(SAMPLE_S)
    raise BenchError(f"not every worker was running after {STARTUP_TIMEOUT_S:.0f}s")


def measure(process: subprocess.Popen, run_dir: Path, seconds: float) -> dict[str, Any]:
    """The window's figures from the controller's CPU time, status.json and metrics."""
    first_row = read_metrics(run_dir)[-1]
    hosts = children(process.pid)
    hosts0 = sum(cpu_seconds(pid) for pid in hosts)
    cpu0, t0 = cpu_seconds(process.pid), time.monotonic()
    ages: list[float] = []
    seen = 0.0
    while time.monotonic() - t0 < seconds:
        time.sleep(SAMPLE_S)
        status = read_status(run_dir) or {}
        if status.get("updated", 0.0) == seen:
            continue
        seen = status["updated"]
        ages += [seen - w["last_heartbeat"] for w in status.get("workers", [])
                 if w.get("last_heartbeat") is not None]
        print(f"\rmeasuring: {time.monotonic() - t0:.0f}/{seconds:.0f} s", end="", flush=True)
    print()
    cpu1, t1 = cpu_seconds(process.pid), time.monotonic()
    hosts1 = sum(cpu_seconds(pid) for pid in hosts)
    last_row = read_metrics(run_dir)[-1]
    span = last_row["time"] - first_row["time"]
    requests = last_row.get("system/name_requests", 0) - first_row.get("system/name_requests", 0)
    return {
        "controller_cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 3),
        "simulator_cpu_cores": round((hosts1 - hosts0) / (t1 - t0), 3),
        "name_requests_per_s": round(requests / span, 1) if span > 0 else None,
        "heartbeat_age_p50_s": round(percentile(ages, 0.5), 3),
        "heartbeat_age_p99_s": round(percentile(ages, 0.99), 3),
        "missed_heartbeats": sum(age > 3 * HEARTBEAT_S for age in ages),
        "heartbeat_ages_sampled": len(ages),
        "worker_exits": last_row.get("system/restarts", 0),
    }


def host_figures(run_dir: Path) -> dict[str, Any]:
    """What the host processes wrote as they stopped: lookup latencies, late heartbeats."""
    probes: list[float] = []
    late = 0
    for path in sorted(run_dir.glob("hosts-*.json")):
        written = json.loads(path.read_text())
        probes += written["probes_s"]
        late += written["late_beats"]
    return {"lookup_p50_ms": round(1000 * percentile(probes, 0.5), 2),
            "lookup_p99_ms": round(1000 * percentile(probes, 0.99), 2),
            "lookups_timed": len(probes), "sim_late_beats": late}


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    busy_warning()
    workdir = Path(tempfile.mkdtemp(prefix="srl_jax-swarm-"))
    run_dir = workdir / "run"
    run_dir.mkdir()
    command = [sys.executable, "-m", "bench.simulated.swarm_controller", "--run-dir", str(run_dir),
               "--workers", str(args.workers), "--hosts", str(args.hosts),
               "--processes", str(args.processes), "--simulate", args.simulate]
    for override in args.overrides:
        command += ["--set", override]
    print(f"swarm: {args.workers} workers on {args.hosts} hosts ({args.processes} host "
          f"processes), {args.seconds:g} s on {nproc()} cores")
    started = time.monotonic()
    with (workdir / "launcher.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        startup = wait_running(process, run_dir, args.workers)
        cpu_at_start = cpu_seconds(process.pid)
        figures = measure(process, run_dir, args.seconds)
        stop(process)
        figures.update(host_figures(run_dir))
    except BenchError as error:
        print(f"bench.swarm: {error}", file=sys.stderr)
        return 1
    finally:
        stop(process)
        release_workdir(workdir, args.keep)
    results = {"workers": args.workers, "hosts": args.hosts, "seconds": args.seconds,
               "simulate": args.simulate,
               "heartbeat_period_s": HEARTBEAT_S, **figures,
               "startup_s": round(startup, 1),
               "startup_controller_cpu_s": round(cpu_at_start, 1),
               "host_processes": args.processes, "elapsed_s": round(time.monotonic() - started)}
    for key, value in results.items():
        print(f"  {key:28s} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        path = args.json
    else:  # one row per worker count, each with its own commit and date
        rows = (read_results("swarm") or {}).get("rows", {})
        rows[f"{args.workers}-{args.simulate}"] = {**results, "commit": git_commit(),
                                   "date": time.strftime("%Y-%m-%d")}
        path = write_results("swarm", {"rows": rows})
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
