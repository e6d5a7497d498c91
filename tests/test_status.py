"""Hang diagnosis: who waits on what, in heartbeats, the controller's log and
`python -m srl_jax.runtime.status`, on a run stalled on purpose.

The stalled run uses the network name service (`runtime.names=network`), as a run
across hosts that share nothing does: workers' logs, stacks included, reach the
controller's run directory over the log stream, and the status tool reads them there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from srl_jax.dataflow.plan import Carriers, make_plan
from srl_jax.dataflow.stream_table import KEY_PREFIX, SAMPLES
from srl_jax.runtime.run_dir import read_run_config, read_status
from srl_jax.runtime.status import dump_stacks, render
from tests.conftest import Processes, all_running, interrupt, launch, read_metrics, wait_for
from tests.test_plan import bound_keys


def status_of(run_dir: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "srl_jax.runtime.status", str(run_dir), *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def section(stacks: str, worker: str) -> str:
    """One worker's part of `--stacks` output."""
    start = stacks.index(f"--- {worker} ")
    end = stacks.find("\n--- ", start)
    return stacks[start:end if end >= 0 else None]


def test_render_shows_rates_restarts_and_waits():
    now = 1000.0
    status = {"experiment": "exp", "run_dir": "runs/exp/1", "state": "running",
              "stop_reason": None, "stalled_for": 42.0, "workers": [
                  {"name": "actor-0", "pid": 11, "state": "running", "restarts": 1,
                   "last_heartbeat": now - 0.5, "waiting_on": "an inference reply",
                   "waiting_since": now - 41.0},
                  {"name": "inference-0", "pid": 12, "state": "running", "restarts": 0,
                   "last_heartbeat": now - 40.0, "waiting_on": None, "waiting_since": None,
                   "platform": "gpu", "devices": [0], "memory_share": 0.3,
                   "device_memory_mib": 140.2, "device_memory_peak_mib": 201.0}]}
    row = {"time": 99.0, "env_frames": 5000, "fps": 0.0, "learner_steps": 7,
           "learner/queue_chunks": 3, "system/restarts": 1}
    text = render(status, row, now)
    assert "at 99.0s, 5000 frames: fps 0, updates 7, learner queue 3, restarts 1" in text
    assert "no new frames or learner steps for 42s" in text
    actor = next(line for line in text.splitlines() if line.startswith("actor-0"))
    assert "0.5s ago" in actor and "an inference reply for 41.0s" in actor
    server = next(line for line in text.splitlines() if line.startswith("inference-0"))
    assert "40.0s ago" in server and "gpu 0 (0.3) 140/201 MiB" in server


def test_status_of_a_directory_that_is_no_run_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "srl_jax.runtime.status", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"srl_jax.runtime.status: {tmp_path} has no status.json (not a run directory, or its "
        "controller has not started yet)"]


def test_stacks_of_a_worker_on_another_host_say_how_to_ask_there(tmp_path: Path) -> None:
    status = {"workers": [{"name": "actor-3", "pid": 4242, "host": "far-away",
                           "state": "running"}]}
    stacks = dump_stacks(tmp_path, status)
    assert "--- actor-3 (pid 4242 on far-away) ---" in stacks
    assert "`kill -USR1 4242` there" in stacks and str(tmp_path / "logs" / "actor-3.log") in stacks


@pytest.mark.slow
def test_a_stalled_run_says_who_waits_on_whom(processes: Processes, tmp_path: Path):
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              "stop.wall_time_s=240", "runtime.stall_timeout_s=2",
                              "runtime.names=network",
                              "runtime.heartbeat_timeout_s=120", "actors.inference_timeout_s=60")
    wait_for(lambda: all_running(run_dir) and read_metrics(run_dir)[-1]["learner_steps"] > 0,
             90, "a training run")
    server = next(w for w in read_status(run_dir)["workers"] if w["name"] == "inference-0")
    controller_log = run_dir / "logs" / "controller.log"
    before = len(controller_log.read_text())
    os.kill(server["pid"], signal.SIGSTOP)  # the server stops answering, the run stalls
    try:
        report = wait_for(lambda: next((
            line for line in controller_log.read_text()[before:].splitlines()
            if "no progress for" in line), None), 60, "the controller's stall report")
        wait_for(lambda: (read_status(run_dir) or {}).get("stalled_for", 0) >= 2, 30,
                 "the stall to show in status.json")
        assert "actor-0 (running, heartbeat" in report
        assert "on an inference reply of policy 'default'" in report
        assert "learner-0 (running" in report and f"on samples on {SAMPLES.key(index=0)}" in report

        table = status_of(run_dir)
        assert "no new frames or learner steps for" in table
        actor = next(line for line in table.splitlines() if line.startswith("actor-0"))
        assert "an inference reply of policy 'default' for" in actor

        stacks = status_of(run_dir, "--stacks")
        actor = section(stacks, "actor-0")
        assert "thread 0x" in actor and "actor_worker.py" in actor, stacks
        assert "no answer" in section(stacks, "inference-0"), "a stopped process cannot answer"
    finally:
        os.kill(server["pid"], signal.SIGCONT)
    frames = read_metrics(run_dir)[-1]["env_frames"]
    wait_for(lambda: read_metrics(run_dir)[-1]["env_frames"] > frames, 30, "progress again")
    interrupt(process, tmp_path / "launch.log")
    final = read_status(run_dir)
    assert all(w["restarts"] == 0 for w in final["workers"]), json.dumps(final)
    bound = {p["key"] for w in final["workers"] for p in w["ports"]
             if p["key"].rpartition("/")[2].startswith(KEY_PREFIX)}
    plan = make_plan(read_run_config(run_dir), Carriers(network_names=True))
    assert bound == bound_keys(plan), "the workers bind what the plan says"
    assert [p["key"] for p in final["ports"]] == [
        "port.changes", "port.names", "port.logs", "port.stats"]
    assert not any((run_dir / "names").glob("*")), "names were served, not written"
    for name in ("actor-0", "inference-0", "learner-0"):
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert log.count(": running\n") == 1 and log.count(": stopped\n") == 1, (name, log)
