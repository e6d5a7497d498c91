"""Scaling sweep: a large cluster's dataflow on one machine, and what the overheads imply.

What it measures
----------------
1. **Overheads of the runtime**: `bench/overhead.py`'s measurements (server CPU
   per inference request, learner CPU per sample, over real sockets without
   policy compute or updates), unless `--skip-overheads`.

2. **Sweep**: the real system (`python -m srl_jax.launch`), with a trivially
   cheap env (`bench/null_env.py`: a step costs about 2 us), a small network
   and a cheap PPO update, against 1..N inference servers and one learner. One
   launch per server count starts the largest actor count; the actors not
   needed at a point of the sweep are paused (SIGSTOP, resumed with SIGCONT), so
   each point is measured without paying the system's start-up again. Per point,
   after `--warmup` seconds, over `--window` seconds: env frames/s, inference
   requests/s, rows per batch, request latency, sample-stream samples/s, and
   every worker's CPU time from /proc/<pid>/stat, giving CPU us per request on
   the servers, per sample on the learner and per frame on the actors.

With both, it says how many actor cores one server core and one learner's
intake feed.

Run from the repository root::

    .venv/bin/python bench/scale.py            # 2-3 minutes on 2 cores
    .venv/bin/python bench/scale.py --quick    # under a minute

Figures go to stdout and to bench/results/scale.json. Every process this script
starts is stopped by its pid (the launcher, which stops its workers; the child).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead
from e2e_fps import (
    REPO_ROOT,
    BenchError,
    busy_warning,
    is_worker_of,
    raise_on_sigterm,
    read_rows,
    stop_process,
)
from machine import config_hash, nproc, release_workdir, write_results
from overhead import BATCH_CHUNKS, IN_FLIGHT, NULL_ENV, TRAJECTORY

from srl_jax.config.schema import ActorConfig, request_rows

DEFAULT_EXPERIMENT = "cartpole_ppo"
SATURATION = 0.9
"""A server count saturates at the fewest actors that reach this share of its best fps."""
CPU_FULL = 0.9
"""The machine's CPU counts as full when the run's processes use this share of it."""
LAUNCH_SAFETY_S = 900
"""stop.wall_time_s of a sweep launch: the script stops it long before, by its pid."""
START_TIMEOUT_S = 150.0
STARTUP_GUESS_S = 20.0
"""Start-up assumed for the budget before the first launch has shown its own."""
ROW_TIMEOUT_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

WORKER_KINDS = ("actor", "inference", "learner", "controller")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/scale.py",
        description="Scaling sweep: throughput of the real system against actor and "
                    "inference server counts on this machine, with the runtime's overhead per "
                    "inference request and per sample (bench/overhead.py).",
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
                        help="sweep only (bench/overhead.py gives the overheads alone)")
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


# -------------------------------------------------------------------- sweep


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


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None


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


def mark_saturation(points: list[Point]) -> dict[str, Any]:
    """Per server count: where throughput stops growing, and where the CPU is full.

    Throughput saturates at the fewest actors that reach SATURATION of that server
    count's best fps (not reached while the last point is the first to get there);
    the CPU is full at the fewest actors whose processes use CPU_FULL of the machine.
    """
    found: dict[str, Any] = {}
    for servers in sorted({p.servers for p in points}):
        group = sorted((p for p in points if p.servers == servers), key=lambda p: p.actors)
        best = max(p.fps for p in group)
        flat = next(p for p in group if p.fps >= SATURATION * best)
        flat.saturated = flat is not group[-1]
        full = next((p for p in group if p.cpu_total_frac >= CPU_FULL), None)
        if full:
            full.cpu_full = True
        found[str(servers)] = {
            "actors": flat.actors if flat.saturated else None, "fps": flat.fps,
            "best_fps": best, "best_actors": max(group, key=lambda p: p.fps).actors,
            "cpu_full_actors": full.actors if full else None,
            "fps_growth": {f"{a.actors}->{b.actors}": b.fps / a.fps - 1
                           for a, b in itertools.pairwise(group)},
        }
    return found


# ------------------------------------------------------------------- output


def print_sweep(points: list[Point]) -> None:
    header = (f"{'actors':>6} {'srv':>3} {'fps':>9} {'req/s':>8} {'rows/b':>6} {'lat_ms':>6} "
              f"{'wait':>5} {'smp/s':>9} {'chunk/s':>7} {'srv_us/req':>10} {'(policy)':>8} "
              f"{'lrn_us/smp':>10} {'act_us/frm':>10} {'cpu':>5}")
    print(header)
    print("-" * len(header))
    for p in points:
        print(f"{p.actors:>6} {p.servers:>3} {p.fps:>9,.0f} {p.inference_requests_per_s:>8,.0f} "
              f"{p.rows_per_batch:>6.1f} {p.request_latency_ms:>6.2f} {p.actor_wait_frac:>5.2f} "
              f"{p.stream_samples_per_s:>9,.0f} {p.stream_chunks_per_s:>7,.0f} "
              f"{p.server_cpu_us_per_request:>10.1f} {p.server_compute_us_per_request:>8.1f} "
              f"{p.learner_cpu_us_per_sample:>10.2f} "
              f"{p.actor_cpu_us_per_frame:>10.2f} {p.cpu_total_frac:>5.0%}"
              + ("  <- throughput saturated" if p.saturated else "")
              + ("  <- CPU full" if p.cpu_full else ""))
    print("  fps: env frames/s; req/s: inference requests/s; rows/b: rows per batch; lat_ms: "
          "request round trip seen by the actor; wait: actor time waiting; smp/s, chunk/s: "
          "sample stream into the learner; *_us: CPU us per request (servers; policy: wall us "
          "of it in the jitted policy call), per sample (learner, update included), per frame "
          "(actors); cpu: all the run's processes' CPU over nproc x wall")


def headline(overheads: dict[str, Any] | None, points: list[Point]) -> dict[str, Any]:
    """The overhead headline (`overhead.headline`), and with the sweep's points how many
    actor cores (at the measured actor CPU per frame of this cheap env: the worst case)
    one server core and one learner intake feed."""
    if not overheads:
        return {}
    head: dict[str, Any] = overhead.headline(overheads)
    per_frame = statistics.median(p.actor_cpu_us_per_frame for p in points) if points else None
    if per_frame:
        frames_per_core = 1e6 / per_frame
        head.update({
            "actor_core_frames_per_s": frames_per_core,
            "actor_cores_per_server_core": head["server_core_rows_per_s"] / frames_per_core,
            "actor_cores_per_learner_intake": head["learner_intake_samples_per_s"]
            / frames_per_core,
        })
    return head


def print_headline(head: dict[str, Any], rows: int) -> None:
    overhead.print_headline(head, rows)
    if "actor_core_frames_per_s" in head:
        print(f"an actor core steps {head['actor_core_frames_per_s']:,.0f} frames/s of this "
              f"env (median over the sweep): one server core feeds "
              f"{head['actor_cores_per_server_core']:.1f} actor cores, one learner's intake "
              f"{head['actor_cores_per_learner_intake']:.0f}")


def print_saturation(saturation: dict[str, Any]) -> None:
    for servers, s in saturation.items():
        growth = ", ".join(f"{step} {g:+.0%}" for step, g in s["fps_growth"].items())
        if s["actors"] is not None:
            where = (f"throughput stops growing at {s['actors']} actors ({s['fps']:,.0f} of at "
                     f"most {s['best_fps']:,.0f} frames/s)")
        else:
            where = (f"throughput still grows at {s['best_actors']} actors "
                     f"({s['best_fps']:,.0f} frames/s)")
        cpu = (f"CPU full (>= {CPU_FULL:.0%} of {nproc()} cores) from {s['cpu_full_actors']} "
               "actors" if s["cpu_full_actors"] else "CPU never full")
        print(f"{servers} server(s): {where}; {cpu}; fps growth {growth}")


def _plain(value: Any) -> Any:
    """JSON-ready: floats rounded, NaN as null (strict JSON has no NaN)."""
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


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
                overheads = overhead.measure_overheads(args.envs, args.micro_seconds)
            except BenchError as error:
                failures.append(f"overheads: {error}")
        points, startups = run_sweep(args, workdir, began + args.budget, failures)
        saturation = mark_saturation(points) if points else {}
        head = headline(overheads, points)
        print()
        if overheads:
            overhead.print_overheads(overheads)
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
            path = write_results("scale", _plain({
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
