"""The Ray backend on a local Ray instance: the same run, placed by Ray.

Every process the launcher started (Ray's own included) is found through the
process tree and must be gone when it exits; nothing is stopped by name.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    Processes,
    all_running,
    launch,
    pid_alive,
    read_metrics,
    read_status,
    wait_for,
    wait_restarted,
    worker,
)

pytestmark = pytest.mark.slow

RAY = ("--backend", "ray")


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc (Ray's servers and workers included)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def launch_ray(processes: Processes, tmp_path: Path, *overrides: str) -> tuple:
    return launch(processes, tmp_path, *overrides, options=RAY)


def test_ray_solves_cartpole_with_a_killed_worker_back_on_a_new_host_and_leaves_nothing(
        processes: Processes, tmp_path: Path) -> None:
    """An actor killed as soon as all workers run comes back on a new Ray host, and the run
    trains on to its target, which takes far longer than a restart (were it reached first,
    the wait for the successor would fail, not pass)."""
    process, run_dir = launch_ray(processes, tmp_path, "stop.wall_time_s=240",
                                  "runtime.restart_backoff_s=0.2", "actors.inference_timeout_s=1")
    wait_for(lambda: all_running(run_dir), 120, "all workers running")
    started = descendants(process.pid)
    victim = worker(read_status(run_dir), "actor-0")["pid"]
    os.kill(victim, signal.SIGKILL)
    restarted = wait_restarted(run_dir, "actor-0", victim, 90)
    assert pid_alive(restarted["pid"])
    started |= descendants(process.pid)
    assert process.wait(timeout=300) == 0, (tmp_path / "launch.log").read_text()
    rows = read_metrics(run_dir)
    assert max(r.get("episode_return_mean", 0) for r in rows) >= 475
    assert all(a["env_frames"] <= b["env_frames"] for a, b in itertools.pairwise(rows))
    assert rows[-1]["system/restarts"] == 1
    final = read_status(run_dir)
    assert final["state"] == "finished" and "reached the target" in final["stop_reason"]
    assert sorted(w["kind"] for w in final["workers"]) == [
        "actor", "actor", "inference", "learner"]
    assert worker(final, "actor-0")["restarts"] == 1
    assert (run_dir / "logs" / "actor-0.log").read_text().count(": running\n") == 2
    for name in ("controller", "learner-0", "inference-0", "actor-0", "actor-1"):
        assert (run_dir / "logs" / f"{name}.log").stat().st_size > 0, name
    assert (run_dir / "config.yaml").exists() and list((run_dir / "checkpoints").iterdir())
    # Workers bind the node's address, so the run authenticates.
    ports = final["ports"] + [p for w in final["workers"] for p in w["ports"]]
    assert len(ports) == 4 and all(p["authenticated"] for p in ports), ports
    assert {w["host"] for w in final["workers"]} == {ports[0]["endpoint"][6:].split(":")[0]}
    leftover = [pid for pid in started if pid_alive(pid)]
    assert not leftover, subprocess.run(["ps", "-o", "pid,cmd", "-p", ",".join(
        map(str, leftover))], capture_output=True, text=True).stdout


def test_a_worker_ray_cannot_place_fails_the_run_with_one_line(
        processes: Processes, tmp_path: Path) -> None:
    process, run_dir = launch_ray(processes, tmp_path, "ray.learner={CPU: 1, GPU: 1}",
                                  "ray.placement_timeout_s=1")
    assert process.wait(timeout=120) == 1, (tmp_path / "launch.log").read_text()
    last = (tmp_path / "launch.log").read_text().strip().splitlines()[-1]
    assert last.startswith("failed: Ray placed no learner-0 in 1s: no node has "
                           "{'CPU': 1.0, 'GPU': 1.0} free (ray.learner)"), last
    assert read_status(run_dir)["state"] == "failed"


def test_a_cluster_address_where_nothing_listens_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir",
         str(tmp_path / "run"), *RAY, "--ray-address", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == ["srl_jax.launch: no Ray cluster at '127.0.0.1:1': "
                     "[Errno 111] Connection refused"], result.stderr
