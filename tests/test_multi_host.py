"""Training across hosts: three network namespaces stand in for three machines.

Host 0 runs the Ray head, the controller, the learner and the inference
server; host 1 a Ray worker node with the actors; host 2 a stranger without
the run's keys. Custom resources (`host0`, `host1`) place the workers. Every
port binds a host's own address, so CURVE is on, and the stranger's
connections are refused and counted. Learning is not what this checks: the run
ends on Ctrl-C once the stranger was refused and the learner has trained since
on the other host's frames. Names, the config and every worker's log come from
the controller over the network (`runtime.names: auto` picks the network name
service for a Ray cluster given by address), each log line once.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from srl_jax.run_dir import read_status
from srl_jax.stream_table import SAMPLES
from tests.conftest import Processes, last_row, stop_when, wait_for
from tests.netns import Host, hosts

pytestmark = pytest.mark.slow

RAY_PORT = 6379
RAY_ENV = {"RAY_AUTH_MODE": "token"}
"""Token authentication between Ray nodes; the token file is this machine's."""
STRANGER = """
import sys, time, zmq
context = zmq.Context()
plain = context.socket(zmq.PUSH)
plain.connect(sys.argv[1])
plain.send_multipart([b"not a message"], flags=0)
print("stranger sent", flush=True)
time.sleep(600)  # connected, retrying its handshake, until the test kills it
"""


def ray_node(processes: Processes, host: Host, tmp_path: Path, head: Host) -> None:
    ray = str(Path(sys.executable).parent / "ray")
    where = (["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"]
             if host is head else ["--address", f"{head.address}:{RAY_PORT}"])
    processes.start(host.command(
        ray, "start", *where, "--node-ip-address", host.address, "--num-cpus", "4",
        "--resources", json.dumps({host.namespace: 100}), "--disable-usage-stats", "--block"),
        log=tmp_path / f"ray-{host.namespace}.log", env=RAY_ENV)


def advertised(run_dir: Path, key: str) -> str | None:
    """The endpoint a worker's heartbeats list under `key` in status.json (the names are
    the controller's: a Ray cluster given by address uses the network name service)."""
    workers = (read_status(run_dir) or {}).get("workers", [])
    return next((p["endpoint"] for w in workers for p in w["ports"] if p["key"] == key), None)


def port_open(host: Host, port: int) -> bool:
    probe = f"import socket; socket.create_connection(('{host.address}', {port}), timeout=1)"
    return subprocess.run(host.command(sys.executable, "-c", probe),
                          capture_output=True).returncode == 0


@pytest.fixture
def ray_pointer() -> Iterator[None]:
    """`ray start --head` points /tmp/ray/ray_current_cluster at its head, where later
    `ray.init()` calls on this machine would look; put back what was there."""
    pointer = Path("/tmp/ray/ray_current_cluster")
    before = pointer.read_text() if pointer.exists() else None
    yield
    if before is None:
        pointer.unlink(missing_ok=True)
    else:
        pointer.write_text(before)


def test_training_across_two_hosts_with_curve_refuses_a_stranger(
        processes: Processes, tmp_path: Path, ray_pointer: None) -> None:
    with hosts(3) as (learner_host, actor_host, stranger_host):
        ray_node(processes, learner_host, tmp_path, learner_host)
        wait_for(lambda: port_open(learner_host, RAY_PORT), 60, "the Ray head")
        ray_node(processes, actor_host, tmp_path, learner_host)
        run_dir = tmp_path / "run"
        args = [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--backend", "ray",
                "--ray-address", f"{learner_host.address}:{RAY_PORT}", "--run-dir",
                str(run_dir), "--quiet"]
        for override in (f"ray.actor={{CPU: 1, {actor_host.namespace}: 1}}",
                         f"ray.learner={{CPU: 1, {learner_host.namespace}: 1}}",
                         f"ray.inference={{CPU: 1, {learner_host.namespace}: 1}}",
                         "stop.target_return=null", "stop.wall_time_s=600"):
            args += ["--set", override]
        launch = processes.start(learner_host.command(*args), log=tmp_path / "launch.log",
                                 env=RAY_ENV)
        endpoint = wait_for(lambda: advertised(run_dir, SAMPLES.key(index=0)), 180,
                            "the learner's sample stream")
        stranger = processes.start(stranger_host.command(sys.executable, "-c", STRANGER,
                                                         endpoint), log=tmp_path / "stranger.log")
        refused = wait_for(lambda: (row := last_row(run_dir)).get("system/auth_refused", 0) >= 1
                           and row, 120, "the stranger refused")
        Processes.kill(stranger.pid)
        assert "stranger sent" in (tmp_path / "stranger.log").read_text()
        # Updates on the actor host's frames after the refusal, then Ctrl-C.
        rows = stop_when(launch, run_dir, lambda row: row["learner_steps"]
                         > refused["learner_steps"], 120, tmp_path / "launch.log")

    assert rows[-1]["learner_steps"] > 0 and rows[-1]["env_frames"] > 0
    assert rows[-1]["system/auth_refused"] >= 1, "the stranger was refused and counted"
    assert rows[-1]["system/wire_rejected"] == 0, "nothing of the stranger's was read"
    status = read_status(run_dir)
    assert status["state"] == "interrupted", status
    placed = {w["name"]: w["host"] for w in status["workers"]}
    assert placed == {"learner-0": learner_host.address, "inference-0": learner_host.address,
                      "actor-0": actor_host.address, "actor-1": actor_host.address}
    ports = [p for p in status["ports"] + [p for w in status["workers"] for p in w["ports"]]
             if p["key"].startswith("port.")]  # ZMQ's: the controller's and the workers'
    assert sorted(p["key"] for p in ports) == sorted([
        "port.names", "port.logs", "port.stats", "port.samples.0", "port.params",
        "port.inference.0"]), "names and logs are the controller's (runtime.names: auto)"
    for port in ports:
        assert port["authenticated"] and port["bind"].startswith(learner_host.address), port
    for name in placed:  # every line once, through the log stream
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert log.count(": running\n") == 1 and log.count(": stopped\n") == 1, (name, log)
    fps = statistics.median(r["fps"] for r in rows if r["env_frames"] > 0)
    print(f"across hosts with CURVE: median {fps:,.0f} env frames/s over "
          f"{rows[-1]['time']:.1f}s")
