"""The sweep of `bench.scale`: one launch per inference server count, its actors paused and
resumed so that each point (actors, servers) is measured without a new start-up."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.launcher import BenchError, is_worker_of, stop_process
from bench.harness.machine import REPO_ROOT, nproc
from bench.harness.run_rows import read_rows
from bench.overhead.cases import BATCH_CHUNKS, TRAJECTORY
from srl_jax.runtime.run_dir import read_status

LAUNCH_SAFETY_S = 900
"""stop.wall_time_s of a sweep launch: the script stops it long before, by its pid."""
START_TIMEOUT_S = 150.0
STARTUP_GUESS_S = 20.0
"""Start-up assumed for the budget before the first launch has shown its own."""
ROW_TIMEOUT_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

WORKER_KINDS = ("actor", "inference", "learner", "controller")


@dataclass
class Point:
    """One point of the sweep: figures over its measurement window."""

    actors: int
    servers: int
    window_s: float
    fps: float
    inference_requests_per_s: float
    inference_batches_per_s: float
    rows_per_request: float
    rows_per_batch: float
    requests_per_batch: float
    request_latency_ms: float
    actor_wait_frac: float
    actor_env_frac: float
    actor_send_frac: float
    inference_compute_frac: float
    stream_samples_per_s: float
    stream_chunks_per_s: float
    learner_samples_per_s: float
    learner_update_frac: float
    policy_lag: float
    cpu_util: dict[str, float] = field(default_factory=dict)
    """CPU seconds per second of each kind of process (all of its processes together)."""
    server_cpu_us_per_request: float = math.nan
    server_compute_us_per_request: float = math.nan
    """The part of it in the jitted policy call (inference/time_compute_frac, wall time)."""
    learner_cpu_us_per_sample: float = math.nan
    actor_cpu_us_per_frame: float = math.nan
    cpu_total_frac: float = math.nan
    """All the run's processes' CPU time over the machine's (nproc x wall)."""
    saturated: bool = False
    """The fewest actors at which this server count's throughput stopped growing."""
    cpu_full: bool = False
    """The fewest actors at which the run's processes filled the machine's CPU."""


def sweep_overrides(args: argparse.Namespace, servers: int, actors: int) -> list[str]:
    """The sweep's config: cheap env, small network, cheap update, no checkpoints."""
    columns = args.envs // args.splits
    return [f"env.id={args.env}", f"actors.count={actors}", f"actors.envs={args.envs}",
            f"actors.splits={args.splits}", f"actors.trajectory_length={TRAJECTORY}",
            f"inference.count={servers}", f"inference.max_batch={args.max_batch}",
            f"inference.min_padded_batch={columns}",
            f"learner.batch_envs={columns * BATCH_CHUNKS}",
            "learner.ppo.epochs=1", "learner.ppo.minibatches=1", "network.hidden=[16,16]",
            "checkpoint.enabled=false",
            # paused actors send no heartbeats; the controller must not restart them
            "runtime.heartbeat_timeout_s=3600", *args.overrides]


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` from /proc/<pid>/stat, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class MetricsTail:
    """metrics.jsonl rows, re-read only when the file grew."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = -1
        self.rows: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return self.rows
        if size != self.size:
            self.size, self.rows = size, read_rows(self.path)
        return self.rows

    def next_row(self, after: int, process: subprocess.Popen[bytes]) -> int:
        """Wait for a row beyond index `after`; return the newest row's index."""
        deadline = time.monotonic() + ROW_TIMEOUT_S
        while len(self.poll()) <= after + 1:
            if process.poll() is not None:
                raise BenchError(f"the launcher exited with code {process.returncode}")
            if time.monotonic() > deadline:
                raise BenchError(f"no metrics row for {ROW_TIMEOUT_S:.0f}s")
            time.sleep(0.05)
        return len(self.rows) - 1


def wait_running(run_dir: Path, process: subprocess.Popen[bytes], tail: MetricsTail,
                 deadline: float) -> dict[str, Any]:
    """status.json once every worker runs and env frames flow."""
    while True:
        if process.poll() is not None:
            raise BenchError(f"the launcher exited with code {process.returncode}")
        status = read_status(run_dir)
        rows = tail.poll()
        if status and status.get("workers") and rows and rows[-1]["env_frames"] > 0 and all(
                w["state"] == "running" and isinstance(w.get("pid"), int)
                for w in status["workers"]):
            return status
        if time.monotonic() > deadline:
            raise BenchError("the system was not running in time")
        time.sleep(0.2)


def _signal_actors(pids: list[int], run_dir: Path, sig: int) -> None:
    for pid in pids:
        if is_worker_of(pid, run_dir):  # by pid, and only our own workers
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _weighted(rows: list[dict[str, Any]], key: str, start_time: float) -> float:
    """Time-weighted mean of a per-row rate over `rows` (each covers since the previous)."""
    total = weight = 0.0
    previous = start_time
    for row in rows:
        dt = row["time"] - previous
        previous = row["time"]
        if isinstance(row.get(key), int | float) and dt > 0:
            total += row[key] * dt
            weight += dt
    return total / weight if weight else math.nan


def point_figures(args: argparse.Namespace, actors: int, servers: int, total_actors: int,
                  rows: list[dict[str, Any]], cpu: dict[str, float], wall: float) -> Point:
    """A sweep point from the rows of its window (rows[0] opens it) and the CPU it used."""
    first, last = rows[0], rows[-1]
    span = last["time"] - first["time"]
    inside = rows[1:]
    frames = last["env_frames"] - first["env_frames"]
    if span <= 0 or frames <= 0:
        raise BenchError(f"{actors} actors, {servers} server(s): no env frames in the window")
    fps = frames / span
    columns = args.envs // args.splits
    chunk_samples = TRAJECTORY * columns

    def mean(key: str) -> float:
        return _weighted(inside, key, first["time"])

    rows_per_batch, requests_per_batch = mean("inference/batch_rows_mean"), mean(
        "inference/requests_per_batch")
    rows_per_request = rows_per_batch / requests_per_batch
    # One inference row per env step: NullEnv never truncates, so no bootstrap rows.
    requests_per_s = fps / rows_per_request
    # The metrics divide actor time by all actors of the run, the paused ones too.
    scale = total_actors / actors
    wait = mean("actor/time_wait_frac") * scale
    # Little's law per split: each split has one request out per cycle of
    # actors * splits / requests_per_s seconds, and is itself stepped for
    # (1 - wait) / splits of it; the rest is its request's round trip.
    cycle = actors * args.splits / requests_per_s
    latency = cycle * (1 - (1 - wait) / args.splits)
    consumed = mean("learner/samples_per_s")
    dropped = (last["samples_dropped_stale"] - first["samples_dropped_stale"]
               + last["learner/samples_dropped_full"] - first["learner/samples_dropped_full"])
    received = consumed + dropped / span  # the drop counters count frames
    util = {kind: cpu.get(kind, 0.0) / wall for kind in WORKER_KINDS}
    return Point(
        actors=actors, servers=servers, window_s=span, fps=fps,
        inference_requests_per_s=requests_per_s,
        inference_batches_per_s=fps / rows_per_batch, rows_per_request=rows_per_request,
        rows_per_batch=rows_per_batch, requests_per_batch=requests_per_batch,
        request_latency_ms=1e3 * latency, actor_wait_frac=wait,
        actor_env_frac=mean("actor/time_env_frac") * scale,
        actor_send_frac=mean("actor/time_send_frac") * scale,
        inference_compute_frac=mean("inference/time_compute_frac"),
        stream_samples_per_s=received, stream_chunks_per_s=received / chunk_samples,
        learner_samples_per_s=consumed, learner_update_frac=mean("learner/time_update_frac"),
        policy_lag=mean("policy_lag_mean"), cpu_util=util,
        server_cpu_us_per_request=1e6 * util["inference"] / requests_per_s,
        server_compute_us_per_request=1e6 * mean("inference/time_compute_frac") * servers
        / requests_per_s,
        learner_cpu_us_per_sample=1e6 * util["learner"] / received if received else math.nan,
        actor_cpu_us_per_frame=1e6 * util["actor"] / fps,
        cpu_total_frac=sum(util.values()) / nproc())


def _pids_by_kind(status: dict[str, Any]) -> dict[str, list[int]]:
    pids: dict[str, list[int]] = {kind: [] for kind in WORKER_KINDS}
    for worker in sorted(status["workers"], key=lambda w: w["index"]):
        pids.setdefault(worker["kind"], []).append(worker["pid"])
    pids["controller"] = [status["controller_pid"]]
    return pids


def _cpu_by_kind(pids: dict[str, list[int]]) -> dict[str, float]:
    return {kind: sum(c for pid in group if (c := cpu_seconds(pid)) is not None)
            for kind, group in pids.items()}


def sweep_servers(args: argparse.Namespace, servers: int, workdir: Path,
                  deadline: float) -> tuple[list[Point], float]:
    """One launch with the most actors: the points of its actor counts, fewest first, and
    its start-up time (until every worker runs and frames flow)."""
    total = max(args.actors)
    run_dir = workdir / f"servers{servers}"
    command = [sys.executable, "-m", "srl_jax.launch", args.experiment, "--run-dir",
               str(run_dir), "--quiet", "--set", "stop.target_return=null",
               "--set", f"stop.wall_time_s={LAUNCH_SAFETY_S}"]
    for override in sweep_overrides(args, servers, total):
        command += ["--set", override]
    points: list[Point] = []
    paused: list[int] = []
    started = time.monotonic()
    with (workdir / f"servers{servers}.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            tail = MetricsTail(run_dir / "metrics.jsonl")
            status = wait_running(run_dir, process, tail,
                                  min(deadline, time.monotonic() + START_TIMEOUT_S))
            pids = _pids_by_kind(status)
            startup = time.monotonic() - started
            print(f"  {servers} server(s), {total} actors: running after {startup:.1f}s",
                  flush=True)
            actor_pids = pids["actor"]
            active = min(args.actors)
            paused = actor_pids[active:]
            _signal_actors(paused, run_dir, signal.SIGSTOP)
            for actors in args.actors:
                if time.monotonic() + args.warmup + args.window > deadline:
                    print(f"  {servers} server(s), {actors} actors: skipped (--budget "
                          f"{args.budget:g}s reached)", flush=True)
                    break
                _signal_actors(actor_pids[active:actors], run_dir, signal.SIGCONT)
                active, paused = actors, actor_pids[actors:]
                time.sleep(args.warmup)
                first = tail.next_row(len(tail.poll()) - 1, process)
                cpu0, wall0 = _cpu_by_kind(pids), time.monotonic()
                time.sleep(max(args.window - 1.0, 0.0))
                last = tail.next_row(len(tail.poll()) - 1, process)
                cpu1, wall1 = _cpu_by_kind(pids), time.monotonic()
                cpu = {kind: cpu1[kind] - cpu0[kind] for kind in cpu1}
                point = point_figures(args, actors, servers, total, tail.rows[first:last + 1],
                                      cpu, wall1 - wall0)
                points.append(point)
                print(f"  {servers} server(s), {actors} actors: {point.fps:,.0f} frames/s, "
                      f"{point.inference_requests_per_s:,.0f} requests/s, latency "
                      f"{point.request_latency_ms:.2f} ms, CPU {point.cpu_total_frac:.0%}",
                      flush=True)
        finally:
            _signal_actors(paused, run_dir, signal.SIGCONT)  # a stopped process cannot exit
            stop_process(process, run_dir)
    return points, startup


def run_sweep(args: argparse.Namespace, workdir: Path, deadline: float,
              failures: list[str]) -> tuple[list[Point], dict[str, float]]:
    """Every server count's launch, within the budget; failures are noted, not raised.
    Returns the points and each launch's start-up time."""
    print(f"sweep: actors {args.actors} x servers {args.servers}, {args.env}, K={args.envs} "
          f"S={args.splits}, warm-up {args.warmup:g}s, window {args.window:g}s ...", flush=True)
    points: list[Point] = []
    startups: dict[str, float] = {}
    for servers in args.servers:
        expected = max(startups.values(), default=STARTUP_GUESS_S) + args.warmup + args.window
        if time.monotonic() + expected > deadline:
            failures.append(f"{servers} server(s): skipped, --budget reached")
            continue
        try:
            launch_points, startups[str(servers)] = sweep_servers(args, servers, workdir,
                                                                  deadline)
            points += launch_points
        except BenchError as error:
            failures.append(f"{servers} server(s): {error}")
            print(f"  {servers} server(s) failed: {error}", file=sys.stderr, flush=True)
    return points, startups
