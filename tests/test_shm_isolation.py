"""Runs that share a host's /dev/shm without sharing anything else: two runs in two PID
namespaces (as two containers with `--ipc=host`), whose pids are the same small numbers,
neither touching the other's shared memory, the first surviving a killed server after the
second has come and gone; and a /dev/shm too small for a run, mounted in a mount namespace
(Docker's 64 MiB, smaller): `auto` runs on ZeroMQ with one line, `on` exits 2 with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srl_jax.launch import EXIT_CONFIG
from srl_jax.runtime.run_dir import read_status
from tests.conftest import (
    Processes,
    all_running,
    descendants,
    last_row,
    read_metrics,
    shm_dir,
    wait_for,
    worker,
)
from tests.paced_env import PACED_ID

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("unshare") is None or subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True).returncode != 0,
    reason="needs unshare and the right to make namespaces")]

LAUNCH = [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--quiet"]
IN_PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]
FRAME_LIMIT = 4000
SMALL = ("actors.count=1", "actors.envs=4", "learner.batch_envs=8")


def overrides(*pairs: str) -> list[str]:
    return [arg for pair in pairs for arg in ("--set", pair)]


def test_runs_in_two_pid_namespaces_leave_each_other_alone(processes: Processes,
                                                           tmp_path: Path) -> None:
    """Run A is held short of its frame limit while run B, in another PID namespace,
    starts, sweeps and finishes; then A's inference server is SIGKILLed, its successor
    meets the actors through shared memory again, and A reaches its frame limit."""
    hold = tmp_path / "hold"
    hold.touch()
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    a = processes.start([*IN_PID_NAMESPACE, *LAUNCH, "--run-dir", str(run_a), *overrides(
        *SMALL, "learner.sample_queue=4",
        f"env.id=tests.paced_env:{PACED_ID}",
        f"env.kwargs={{step_s: 0.0, held_while: {hold}}}",
        f"stop.env_frames={FRAME_LIMIT}", "stop.wall_time_s=240")],
        log=tmp_path / "a.log")
    wait_for(lambda: all_running(run_a) and last_row(run_a).get("env_frames", 0) > 0, 120,
             "run A under way")
    directory_a = shm_dir(run_a)
    files_a = sorted(directory_a.iterdir())
    assert any(path.suffix == ".slots" for path in files_a)
    b = subprocess.run([*IN_PID_NAMESPACE, *LAUNCH, "--run-dir", str(run_b), *overrides(
        *SMALL, "stop.env_frames=2000")], capture_output=True, text=True, timeout=180)
    assert b.returncode == 0, b.stdout + b.stderr
    assert read_status(run_b)["controller_pid"] == read_status(run_a)["controller_pid"], \
        "the two controllers have one pid, each in its namespace"
    assert not shm_dir(run_b).exists(), "B removed its own shared memory"
    assert sorted(directory_a.iterdir()) == files_a, "B's start swept nothing of A's"
    assert last_row(run_a)["env_frames"] < FRAME_LIMIT, "A is still held"

    [server] = [pid for pid in descendants(a.pid)
                if b"inference" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    Processes.kill(server)
    wait_for(lambda: (worker(read_status(run_a), "inference-0") or {}).get("restarts") == 1
             and all_running(run_a), 120, "A's inference server restarted")
    restarted_at = last_row(run_a)["env_frames"]
    hold.unlink()
    assert a.wait(timeout=120) == 0, (tmp_path / "a.log").read_text()
    status = read_status(run_a)
    assert f"reached the limit {FRAME_LIMIT}" in status["stop_reason"], status["stop_reason"]
    after = [row for row in read_metrics(run_a) if row["env_frames"] > restarted_at]
    assert after and all(row["inference/shm_frac"] == 1.0 for row in after
                         if row.get("inference/shm_frac") is not None), \
        "the successor's requests came through shared memory"
    assert not directory_a.exists()


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_small_dev_shm_falls_back_or_refuses_before_launch(mode: str,
                                                              tmp_path: Path) -> None:
    """/dev/shm of 64 KiB (the run's actor, with 32 chunk slots, needs 113 KiB; the rest
    of the run a few pages for semaphores): auto says what it needs and runs on ZeroMQ;
    on exits 2 with the same reason, before any worker starts."""
    script = "mount -t tmpfs -o size=64k tmpfs /dev/shm && exec \"$@\""
    run = tmp_path / "run"
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", *LAUNCH, "--run-dir", str(run),
         *overrides(f"transport.shared_memory={mode}", "stop.env_frames=500", *SMALL,
                   "actors.send_queue=32")],
        capture_output=True, text=True, timeout=180)
    line = "of shared memory and /dev/shm has 64 KiB free"
    if mode == "on":
        assert result.returncode == EXIT_CONFIG and line in result.stderr, result.stderr
        assert "--shm-size" in result.stderr and not (run / "logs").exists()
        return
    assert result.returncode == 0, result.stdout + result.stderr
    assert line in result.stdout and "ZeroMQ carries" in result.stdout
    row = last_row(run)
    assert row["actor/shm_mib"] == 0 and row["inference/shm_frac"] == 0 and \
        read_status(run)["shared_memory"] is None
