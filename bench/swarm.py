"""The control plane at thousands of workers, on one small machine: the real controller
and name service, and simulated workers on simulated hosts.

What it measures
----------------
It starts the controller (bench/simulated/swarm_controller.py: the real `Controller` with the
network name service, CURVE keys as on a cluster, the product's heartbeat timeout in the
window (start-up gets 600 s: a host process starts its workers one after another), its
metrics rows and status.json every second, its supervisor), whose launch backend puts
`--workers` simulated workers on `--hosts` simulated hosts (bench/simulated/swarm_hosts.py):
per host a real host agent (srl_jax/runtime/hosts/host_agent.py), per worker real sockets and
the messages a real worker of its kind sends, made by the same code (heartbeats with the
kind's counters, ports and what it waits on, every `runtime.stats_interval_s`; config,
lookups, registers, episode returns, log lines), and no data at all. Once every worker
has reported running it measures for `--seconds` (the window):

- `controller_cpu_cores`: the controller process's CPU time over the window, in cores;
  `controller_us_per_heartbeat`: that CPU time over the heartbeats and signs of life it
  took (its metrics' `system/heartbeats` and `system/signs_of_life`);
- `name_requests_per_s`: requests its name service answered, per second;
- `heartbeat_age_p50_s`, `heartbeat_age_p99_s`: the age of the newest heartbeat the
  controller holds for each worker (status.json's `last_heartbeat` against its
  `updated`), over every worker in every status.json read in the window;
  `missed_heartbeats`: of those, the ages above 3 heartbeat periods;
- `lookup_p99_ms`: a `get` each simulated worker times at its host agent every 10 s;
- churn (`--churn F`): a fraction F of the actors and servers killed per minute, as by
  SIGKILL, and one host agent down for a few seconds every few minutes; `churn` says how
  many, how long each killed worker took to run again (p50, p99: status.json's 1 s
  resolution) and whether every one runs again by the end (the bench waits up to
  RECOVERY_S after the window); `false_kills`: workers the controller killed or
  stopped while they were alive and heartbeating; `restarts_charged`: the run's restarts;
- `startup_s`: from the controller's start until every worker reported running.

The simulator measures itself. A beat sent more than one period after it was due (or
not at all) is late: `simulator_late_fraction` is late over due beats in the window, and
a row with more than MAX_LATE of them is marked invalid (`valid: false`, with the
reason), written, and the bench exits 1: its figures are the simulator's, not the
controller's. `simulator_cpu_cores` is what the host processes used (agents included);
`simulator_us_per_beat` the same per heartbeat sent, and `simulated_workers_us_per_beat`
the simulated workers' own share (the host processes' main threads).

Run from the repository root::

    .venv/bin/python -m bench.swarm --workers 10000 --hosts 100 --seconds 60 --churn 0.01

Results go to `bench/results/swarm.json`, one row per worker count (`10000-workers`), or
to `--json PATH` (that row alone), with the commit and the machine. SIGTERM or SIGINT
stops it; every process it starts (the controller and its host processes) is stopped
by its pid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness.launcher import BenchError, busy_warning, raise_on_sigterm, release_workdir
from bench.harness.machine import REPO_ROOT, RESULTS_DIR, git_commit, nproc, write_results
from bench.simulated.swarm_hosts import WINDOW_FILE
from srl_jax.runtime.run_dir import read_metrics, read_status

STARTUP_TIMEOUT_S = 600.0
SAMPLE_S = 1.0
RECOVERY_S = 60.0
"""How long after the window the bench waits for every churned worker to run again."""
STOP_S = 60.0
"""How long the controller gets to stop its workers and host processes."""
MAX_LATE = 0.01
"""The largest fraction of late beats in a valid row."""
WORKERS_PER_PROCESS = 2500
FILES_PER_WORKER = 12
"""A host process's open files per simulated worker (9.5 measured at 500 a process: its
sockets' and its agent's ends), with room: the process count keeps each under the hard
RLIMIT_NOFILE."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=0,
                        help="host processes (0: as few as the open-file limit allows, at "
                        "least 2: each costs the machine more than its workers do)")
    parser.add_argument("--simulate", choices=("workers", "agents"), default="agents",
                        help="agents: hands each heartbeat to the agent in its process "
                        "(what reaches the controller is the same); workers: each "
                        "simulated worker sends its heartbeats on a socket of its own to its "
                        "host's agent")
    parser.add_argument("--churn", type=float, default=0.0,
                        help="fraction of the actors and inference servers killed per minute "
                        "in the window (and a host agent restarted every few minutes)")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file for this row alone (default: its row in "
                        "bench/results/swarm.json)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="a config override for the controller (key=value)")
    args = parser.parse_args(argv)
    if args.hosts < 1 or args.workers < 3 or args.seconds <= 0 or not 0 <= args.churn < 1:
        parser.error("--hosts must be at least 1, --workers at least 3, --seconds positive, "
                     "--churn in [0, 1)")
    per_process = min(WORKERS_PER_PROCESS, resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                      // FILES_PER_WORKER)
    args.processes = args.processes or max(2, min(args.hosts, -(-args.workers // per_process)))
    return args


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def started_at(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), which tells it from a later process
    given the same pid; None where it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError):
        return None


class Started:
    """The processes the bench started, directly or through the controller, by pid."""

    def __init__(self, controller: subprocess.Popen) -> None:
        self.controller = controller
        self.hosts: dict[int, int | None] = {}
        """Host process pid: its start time."""

    def note_hosts(self) -> list[int]:
        """The controller's children (its host processes), noted for the stop."""
        for pid in children(self.controller.pid):
            self.hosts.setdefault(pid, started_at(pid))
        return list(self.hosts)

    def stop(self) -> None:
        """SIGTERM to the controller (which stops its workers and host processes), then
        SIGTERM and SIGKILL to whatever of them is left."""
        self.note_hosts()
        if self.controller.poll() is None:
            self.controller.send_signal(signal.SIGTERM)
            try:
                self.controller.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.controller.kill()
                self.controller.wait()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = [pid for pid, start in self.hosts.items()
                    if start is not None and started_at(pid) == start]
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10.0
            while left and time.monotonic() < deadline:
                left = [pid for pid in left if started_at(pid) == self.hosts[pid]]
                time.sleep(0.1)
            if not left:
                return


def read_results(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def children(pid: int) -> list[int]:
    """The processes `pid` started (the host processes, for the controller)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return found


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def wait_running(started: Started, run_dir: Path, workers: int) -> float:
    """Seconds until status.json shows every worker running."""
    process = started.controller
    t0 = time.monotonic()
    shown = -1
    while time.monotonic() - t0 < STARTUP_TIMEOUT_S:
        if process.poll() is not None:
            raise BenchError(f"the controller exited with {process.returncode}; see "
                             f"{run_dir / 'logs'}")
        started.note_hosts()
        status = read_status(run_dir) or {}
        running = sum(w.get("state") == "running" for w in status.get("workers", []))
        if running != shown:
            shown = running
            print(f"\rstarting: {running}/{workers} workers running", end="", flush=True)
        if running == workers:
            print()
            return time.monotonic() - t0
        time.sleep(SAMPLE_S)
    raise BenchError(f"not every worker was running after {STARTUP_TIMEOUT_S:.0f}s")


def host_reports(run_dir: Path) -> dict[str, Any]:
    """The host processes' figures so far, summed (each rewrites its file every second)."""
    total: dict[str, Any] = {"due": 0, "late": 0, "beats": 0, "workers_cpu_s": 0.0,
                             "kills": [], "agent_restarts": [], "killed_alive": [],
                             "terminated_alive": 0, "probes_s": []}
    for path in sorted(run_dir.glob("hosts-*.json")):
        with contextlib.suppress(FileNotFoundError, ValueError):
            for key, value in json.loads(path.read_text()).items():
                if key in total:
                    total[key] += value
    return total


class StatusWatch:
    """What the status.json reads show: heartbeat ages (in the window), and when each
    (worker, pid) was first seen running."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ages: list[float] = []
        self.first_running: dict[tuple[str, int], float] = {}
        self._seen = 0.0

    def sample(self, ages: bool) -> None:
        status = read_status(self.run_dir) or {}
        updated = status.get("updated", 0.0)
        if updated == self._seen:
            return
        self._seen = updated
        for worker in status.get("workers", []):
            if worker.get("state") == "running":
                self.first_running.setdefault((worker["name"], worker["pid"]), updated)
            if ages and worker.get("last_heartbeat") is not None:
                self.ages.append(updated - worker["last_heartbeat"])

    def back_running(self, kill: dict[str, Any]) -> float | None:
        """Seconds from `kill` until a successor of the killed process was seen running."""
        times = [at for (name, pid), at in self.first_running.items()
                 if name == kill["worker"] and pid != kill["pid"] and at >= kill["at"]]
        return min(times) - kill["at"] if times else None


def measure(started: Started, run_dir: Path, seconds: float, period: float
            ) -> dict[str, Any]:
    """The window's figures, from the controller's CPU time, status.json, its metrics and
    the host processes' own reports; then the churned workers' return."""
    process = started.controller
    watch = StatusWatch(run_dir)
    (run_dir / WINDOW_FILE).touch()
    time.sleep(2 * SAMPLE_S)  # every host process has seen the window open
    first_row, report0 = read_metrics(run_dir)[-1], host_reports(run_dir)
    hosts = started.note_hosts()
    hosts0 = sum(cpu_seconds(pid) for pid in hosts)
    cpu0, t0 = cpu_seconds(process.pid), time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(SAMPLE_S)
        if process.poll() is not None:
            raise BenchError(f"the controller exited with {process.returncode} in the window")
        watch.sample(ages=True)
        print(f"\rmeasuring: {time.monotonic() - t0:.0f}/{seconds:.0f} s", end="", flush=True)
    print()
    cpu1, t1 = cpu_seconds(process.pid), time.monotonic()
    hosts1 = sum(cpu_seconds(pid) for pid in hosts)
    last_row, report1 = read_metrics(run_dir)[-1], host_reports(run_dir)
    (run_dir / WINDOW_FILE).unlink()
    time.sleep(2 * SAMPLE_S)  # every host process has seen it close: no more kills
    kills = host_reports(run_dir)["kills"]
    deadline = time.monotonic() + RECOVERY_S
    while kills and time.monotonic() < deadline and \
            any(watch.back_running(kill) is None for kill in kills):
        time.sleep(SAMPLE_S)
        watch.sample(ages=False)
    report = host_reports(run_dir)
    end_row = read_metrics(run_dir)[-1]
    span, elapsed = last_row["time"] - first_row["time"], t1 - t0
    requests = last_row.get("system/name_requests", 0) - first_row.get("system/name_requests", 0)
    taken: dict[str, float] = {  # a second, from the controller's metrics
        name: (last_row[name] - first_row[name]) / span
        for name in ("system/heartbeats", "system/signs_of_life")
        if span > 0 and name in last_row and name in first_row}
    cores = (cpu1 - cpu0) / elapsed
    per_s = sum(taken.values()) if len(taken) == 2 else None
    due, late = report1["due"] - report0["due"], report1["late"] - report0["late"]
    beats = report1["beats"] - report0["beats"]
    back = [watch.back_running(kill) for kill in kills]
    returned = [b for b in back if b is not None]
    return {
        "controller_cpu_cores": round(cores, 3),
        "controller_us_per_heartbeat": round(1e6 * cores / per_s, 1) if per_s else None,
        "heartbeats_per_s": rounded(taken.get("system/heartbeats"), 1),
        "signs_of_life_per_s": rounded(taken.get("system/signs_of_life"), 1),
        "name_requests_per_s": round(requests / span, 1) if span > 0 else None,
        "heartbeat_age_p50_s": rounded(percentile(watch.ages, 0.5), 3),
        "heartbeat_age_p99_s": rounded(percentile(watch.ages, 0.99), 3),
        "missed_heartbeats": sum(age > 3 * period for age in watch.ages),
        "heartbeat_ages_sampled": len(watch.ages),
        "false_kills": len(report["killed_alive"]) + report["terminated_alive"],
        "restarts_charged": end_row.get("system/restarts", 0),
        "churn": {"per_minute": None, "workers_killed": len(kills),
                  "agent_restarts": len(report1["agent_restarts"]),
                  "back_to_running_p50_s": rounded(percentile(returned, 0.5), 1),
                  "back_to_running_p99_s": rounded(percentile(returned, 0.99), 1),
                  "all_running_again": len(returned) == len(kills)},
        "simulator_late_fraction": round(late / due, 5) if due else None,
        "simulator_beats_due": due,
        "simulator_cpu_cores": round((hosts1 - hosts0) / elapsed, 3),
        "simulator_us_per_beat": round(1e6 * (hosts1 - hosts0) / beats, 1) if beats else None,
        "simulated_workers_us_per_beat": round(
            1e6 * (report1["workers_cpu_s"] - report0["workers_cpu_s"]) / beats, 1)
        if beats else None,
    }


def validity(figures: dict[str, Any]) -> dict[str, Any]:
    """Whether the row is the controller's: the simulator sent its beats in time."""
    late = figures["simulator_late_fraction"]
    if late is None:
        return {"valid": False, "invalid_reason": "the simulator sent no beats in the window"}
    if late > MAX_LATE:
        return {"valid": False, "invalid_reason": f"the simulator sent {late:.1%} of its beats "
                f"more than a period late (at most {MAX_LATE:.0%} for a valid row)"}
    return {"valid": True}


def run_settings(run_dir: Path) -> dict[str, Any]:
    """The run's heartbeat period and timeout (the window's) and whether it has CURVE, from
    the config the controller wrote."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {"curve": bool(config["transport"]["curve"]),
            "heartbeat_period_s": float(config["runtime"]["stats_interval_s"]),
            "heartbeat_timeout_s": float(config["runtime"]["heartbeat_timeout_s"])}


def write_row(args: argparse.Namespace, results: dict[str, Any]) -> Path:
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        return args.json
    rows = {key: row for key, row in (read_results("swarm") or {}).get("rows", {}).items()
            if row["workers"] != args.workers}  # one row per worker count (older keys too)
    rows[f"{args.workers}-workers"] = {**results, "commit": git_commit(),
                                       "date": time.strftime("%Y-%m-%d")}
    return write_results("swarm", {"rows": rows})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too where a shell ignored it for us
        signal.signal(sig, raise_on_sigterm)
    busy_warning()
    workdir = Path(tempfile.mkdtemp(prefix="srl_jax-swarm-"))
    run_dir = workdir / "run"
    run_dir.mkdir()
    command = [sys.executable, "-m", "bench.simulated.swarm_controller", "--run-dir", str(run_dir),
               "--workers", str(args.workers), "--hosts", str(args.hosts),
               "--processes", str(args.processes), "--simulate", args.simulate,
               "--churn", str(args.churn)]
    for override in args.overrides:
        command += ["--set", override]
    print(f"swarm: {args.workers} workers on {args.hosts} hosts ({args.processes} host "
          f"processes), {args.seconds:g} s on {nproc()} cores")
    t0 = time.monotonic()
    with (workdir / "launcher.log").open("wb") as log:
        started = Started(subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True))
    try:
        startup = wait_running(started, run_dir, args.workers)
        cpu_at_start = cpu_seconds(started.controller.pid)
        settings = run_settings(run_dir)
        figures = measure(started, run_dir, args.seconds, settings["heartbeat_period_s"])
        figures["churn"]["per_minute"] = args.churn
        started.stop()
        probes = host_reports(run_dir)["probes_s"]
    except BenchError as error:
        print(f"bench.swarm: {error}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # the stop is not cut short
            signal.signal(sig, signal.SIG_IGN)
        started.stop()
        release_workdir(workdir, args.keep)
    results = {"workers": args.workers, "hosts": args.hosts, "seconds": args.seconds,
               "simulate": args.simulate, **settings,
               **validity(figures), **figures,
               "lookup_p50_ms": rounded(percentile([1000 * p for p in probes], 0.5), 2),
               "lookup_p99_ms": rounded(percentile([1000 * p for p in probes], 0.99), 2),
               "lookups_timed": len(probes),
               "startup_s": round(startup, 1),
               "startup_controller_cpu_s": round(cpu_at_start, 1),
               "host_processes": args.processes, "elapsed_s": round(time.monotonic() - t0)}
    for key, value in results.items():
        print(f"  {key:30s} {value}")
    print(f"written to {write_row(args, results)}")
    if not results["valid"]:
        print(f"bench.swarm: invalid row: {results['invalid_reason']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
