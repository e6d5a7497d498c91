"""End to end: real launcher, controller and worker processes on loopback."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srl_jax.runtime.backends import LocalBackend
from tests.conftest import (
    CARTPOLE_MARGIN,
    CARTPOLE_RANDOM_RETURN,
    Processes,
    all_running,
    assert_learned,
    ended_on_frames,
    launch,
    pid_alive,
    read_metrics,
    read_status,
    shm_dir,
    wait_for,
    worker,
)
from tests.paced_env import SMALL_PACED_RUN

pytestmark = pytest.mark.slow
IMPALA_FRAMES = 100_000
"""The IMPALA run's frame budget: there the best mean return of 100 episodes was 290-450 (4
runs on 2 cores under others' load), at 80,000 frames 200-300 (5 runs); it used to stop at
a return of 300, at 70,000-95,000. Two of the 9 runs unlearned after their best: one, at a
policy lag of 10-15 versions (a load of 14), fell from 414 to 24 within 40 updates."""


def test_impala_learns_cartpole_on_envpool_with_inline_inference_on_four_devices(
        processes: Processes, tmp_path: Path) -> None:
    """One run covers several features, so the suite pays for one training run, not four.
    It stops on its frame budget, IMPALA_FRAMES, and its last 100 episodes must beat random
    play by CARTPOLE_MARGIN. The default experiment (PPO, remote inference) learns in
    tests/test_distributed.py (two learner processes; on Ray in tests/test_ray_backend.py),
    and the LSTM config in tests/test_recurrent_run.py."""
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              f"stop.env_frames={IMPALA_FRAMES}",
                              "env.backend=envpool", "actors.inline_inference=true",
                              "learner.devices=4", experiment="cartpole_impala",
                              env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    rows, final = ended_on_frames(process, run_dir, IMPALA_FRAMES, tmp_path / "launch.log")
    assert_learned(rows, CARTPOLE_RANDOM_RETURN, CARTPOLE_MARGIN)
    assert all(a["env_frames"] <= b["env_frames"] for a, b in itertools.pairwise(rows))
    assert rows[-1]["system/wire_rejected"] == 0
    kinds = sorted(w["kind"] for w in final["workers"])
    assert kinds == ["actor", "actor", "learner"], "inline inference: no server"
    assert len({w["pid"] for w in final["workers"]} | {final["controller_pid"]}) == 4
    assert any("policy_lag_mean" in r for r in rows)
    assert "impala on 4 device(s)" in (run_dir / "logs" / "learner-0.log").read_text()


def test_ctrl_c_stops_every_worker_within_seconds(processes: Processes, tmp_path: Path) -> None:
    """No frame limit, so the run is training when Ctrl-C comes. Killed actors and
    inference servers, restarted, are in tests/test_recurrent_run.py (a run that reaches
    its target through both)."""
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              "stop.wall_time_s=600", *SMALL_PACED_RUN)
    wait_for(lambda: all_running(run_dir) and (rows := read_metrics(run_dir))
             and rows[-1]["learner_steps"] > 0, 90, "all workers running and training")
    status = read_status(run_dir)
    startup = status["startup"]
    for steps in startup["workers"].values():
        assert startup["controller_s"] <= steps["spawned_s"] <= steps["heard_s"] \
            <= steps["running_s"], startup
    assert startup["first_frame_s"] >= min(
        steps["running_s"] for name, steps in startup["workers"].items()
        if name.startswith("actor-")), startup
    pids = [w["pid"] for w in status["workers"]]
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=15) == 130, (tmp_path / "launch.log").read_text()
    wait_for(lambda: not any(pid_alive(p) for p in pids), 5, "every worker gone")
    assert time.monotonic() - started < 10
    rows = read_metrics(run_dir)
    assert rows[-1]["system/restarts"] == 0
    assert all(a["env_frames"] <= b["env_frames"] for a, b in itertools.pairwise(rows))
    status = read_status(run_dir)
    assert status["state"] == "interrupted" and "interrupted" in status["stop_reason"]
    assert all(w["state"] == "stopped" for w in status["workers"])


def test_workers_exit_when_the_controller_is_killed(processes: Processes,
                                                    tmp_path: Path) -> None:
    process, run_dir = launch(processes, tmp_path, "stop.wall_time_s=300", *SMALL_PACED_RUN)
    wait_for(lambda: all_running(run_dir), 90, "all workers running")
    directory = shm_dir(run_dir)
    assert directory is not None and any(directory.glob("*.slots")), \
        "the workers met through shared memory"
    status = read_status(run_dir)
    pids = [w["pid"] for w in status["workers"]] + [w["pid"] for w in status["warm_parents"]]
    assert len(status["warm_parents"]) == 1, "the learner and the server were forked warm"
    process.kill()
    process.wait()
    wait_for(lambda: not any(pid_alive(p) for p in pids), 15,
             "orphaned workers and the warm parent to exit")
    # The killed controller's shared memory waits for the next run on this host, whose
    # launch backend removes it when it starts, and its own when it ends. Another test's
    # run may be that next run, so whether it is still there now is not asserted
    # (tests/test_shared_memory.py covers the sweep: only directories of owners gone).
    LocalBackend(tmp_path / "next").close()
    assert not directory.exists()


def test_config_error_leaves_no_run(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--set",
                             "actors.envs=15", "--run-dir", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "'actors.splits' (2) must divide 'actors.envs' (15)" in result.stderr


def test_without_checkpoints_learner_death_ends_the_run_with_a_reason(
        processes: Processes, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = processes.start(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir", str(run_dir),
         "--quiet", "--set", "stop.wall_time_s=300", "--set", "checkpoint.enabled=false",
         *(arg for override in SMALL_PACED_RUN for arg in ("--set", override))],
        stderr_to=tmp_path / "stderr.log")
    wait_for(lambda: all_running(run_dir), 90, "all workers running")
    status = read_status(run_dir)
    Processes.kill(worker(status, "learner-0")["pid"])
    assert process.wait(timeout=30) == 1
    lines = (tmp_path / "stderr.log").read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("failed: learner-0 exited with code -9")
    assert "learner-0.log" in lines[0]
    final = read_status(run_dir)
    assert final["state"] == "failed"
    assert not any(pid_alive(w["pid"]) for w in final["workers"])
