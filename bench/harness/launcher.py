"""Launcher runs for the benchmarks: start `python -m srl_jax.launch` in its own session,
stop it and any worker it left by pid, in scratch run directories released after."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from bench.harness.machine import REPO_ROOT, nproc
from srl_jax.runtime.run_dir import read_status

STOP_GRACE_S = 20.0
WATCH_S = 1.0
"""How often `run_launcher` asks its `stop_when` whether to stop the run."""
"""How long the launcher gets to stop its workers after SIGTERM before it is killed."""
RUN_TIMEOUT_MARGIN_S = 180.0
"""Allowed on top of --seconds for start-up and shutdown before a run counts as hung."""


class BenchError(RuntimeError):
    """A run that produced no usable figures."""


def raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_worker_of(pid: int, run_dir: Path) -> bool:
    """Whether `pid` is still an srl_jax worker of `run_dir` (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "srl_jax.worker" in cmdline and str(run_dir) in cmdline


def _leftover_workers(run_dir: Path) -> list[int]:
    """Worker pids from `status.json` that still run as workers of this run directory."""
    status = read_status(run_dir) or {}
    pids = [w.get("pid") for w in status.get("workers", [])]
    return [p for p in pids if isinstance(p, int) and _alive(p) and is_worker_of(p, run_dir)]


def stop_process(process: subprocess.Popen[bytes], run_dir: Path) -> None:
    """SIGTERM the launcher (it stops its workers), SIGKILL it after a grace period.

    The launcher runs in its own session, so a Ctrl-C here does not reach it; it
    is stopped only through its pid. Workers it leaves behind (only if it had to
    be killed) are looked up by pid in the run's `status.json` and killed too.
    """
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=STOP_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            process.kill()
            process.wait()
    deadline = time.monotonic() + 5.0
    while (leftover := _leftover_workers(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)  # workers stop by themselves once their controller is gone
    for pid in leftover:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_experiment(args: argparse.Namespace, run_dir: Path, log_path: Path) -> int:
    """One launcher run of `args.experiment` with `args.overrides` to its wall-time limit
    `args.seconds`, past any target return; returns its exit code."""
    command = [sys.executable, "-m", "srl_jax.launch", args.experiment,
               "--run-dir", str(run_dir), "--quiet",
               "--set", "stop.target_return=null",
               "--set", f"stop.wall_time_s={args.seconds:g}"]
    for override in args.overrides:
        command += ["--set", override]
    return run_launcher(command, run_dir, log_path, args.seconds + RUN_TIMEOUT_MARGIN_S)


def run_launcher(command: list[str], run_dir: Path, log_path: Path, timeout_s: float,
                 stop_when: Callable[[], bool] | None = None) -> int:
    """Run a launcher command in its own session, logging to `log_path`; its exit code.
    With `stop_when`, asked every `WATCH_S` while the run goes on: once it says so, the
    launcher gets SIGINT (by its pid; it stops cleanly on it). BenchError past
    `timeout_s`; the launcher and its workers are stopped by pid either way."""
    deadline = time.monotonic() + timeout_s
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while stop_when is not None and process.poll() is None:
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(command, timeout_s)
                if stop_when():
                    process.send_signal(signal.SIGINT)
                    break
                time.sleep(WATCH_S)
            return process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise BenchError(f"did not finish within {timeout_s:.0f}s") from None
        finally:
            stop_process(process, run_dir)


def busy_warning() -> str | None:
    """A warning when the machine is already busy (figures would come out low), else None."""
    if not hasattr(os, "getloadavg"):
        return None
    load = os.getloadavg()[0]
    if load < 0.5 * nproc():
        return None
    message = f"WARNING: 1-min load average was {load:.1f} at start: the machine was busy"
    print(message, flush=True)
    return message


def in_workdir(prefix: str, keep: bool, body: Callable[[Path], int]) -> int:
    """`body(workdir)` in a new scratch directory, released after (see `release_workdir`);
    Ctrl-C returns 130 once the body's own cleanup has stopped its processes."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return body(workdir)
    except KeyboardInterrupt:
        return 130
    finally:
        release_workdir(workdir, keep)


def release_workdir(workdir: Path, keep: bool) -> None:
    """Remove a harness's scratch run directories, or say where they were kept."""
    if keep:
        print(f"run directories kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
