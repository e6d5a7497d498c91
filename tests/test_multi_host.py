"""Training across hosts that share nothing but the network: three network namespaces
stand in for three machines, each with its own files.

Host 0 runs the Ray head, the controller and the actors, and alone holds the run
directory; host 1 a Ray worker node with the learner and the inference server, which
checkpoints to a directory of its own (`checkpoint.dir`); host 2 a stranger without
the run's keys. Each host sees its own directory at the run's path, at Ray's
`/tmp/ray` and at `~/.ray` (tests/netns.py `own_disks`), so nothing passes between
them but the network: names, the config and every worker's log come from the
controller over it (`runtime.names: auto` picks the network name service for a Ray
cluster given by address), and Ray's token comes in the environment. Custom
resources (the namespaces' names) place the workers. Every port binds a host's own
address, so CURVE is on, and the stranger's connections are refused and counted.
The learner is killed once it has checkpointed; Ray places it again on its host,
where it restores its newest step. The run ends on Ctrl-C once the learner has
trained past that step on the other host's frames.
"""

from __future__ import annotations

import json
import re
import secrets
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from srl_jax.config.checkpoint_location import steps_in
from srl_jax.dataflow.stream_table import SAMPLES
from srl_jax.runtime.run_dir import read_status
from tests.conftest import (
    Processes,
    last_row,
    read_metrics,
    stop_when,
    wait_for,
    wait_restarted,
    worker,
)
from tests.netns import Host, hosts, own_disks

pytestmark = pytest.mark.slow

RAY_PORT = 6379
RESTORED = re.compile(r"restored checkpoint step (\d+)")
STRANGER = """
import sys, time, zmq
context = zmq.Context()
plain = context.socket(zmq.PUSH)
plain.connect(sys.argv[1])
plain.send_multipart([b"not a message"], flags=0)
print("stranger sent", flush=True)
time.sleep(600)  # connected, retrying its handshake, until the test kills it
"""


def ray_node(processes: Processes, host: Host, tmp_path: Path, head: Host,
             env: dict[str, str]) -> None:
    ray = str(Path(sys.executable).parent / "ray")
    where = (["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"]
             if host is head else ["--address", f"{head.address}:{RAY_PORT}"])
    processes.start(host.command(
        ray, "start", *where, "--node-ip-address", host.address, "--num-cpus", "4",
        "--resources", json.dumps({host.namespace: 100}), "--disable-usage-stats", "--block"),
        log=tmp_path / f"ray-{host.namespace}.log", env=env)


def advertised(run_dir: Path, key: str) -> str | None:
    """The endpoint a worker's heartbeats list under `key` in status.json."""
    workers = (read_status(run_dir) or {}).get("workers", [])
    return next((p["endpoint"] for w in workers for p in w["ports"] if p["key"] == key), None)


PROBE = """
import socket, sys, time
address, deadline = (sys.argv[1], int(sys.argv[2])), time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection(address, timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"nothing listens on {address} after {sys.argv[3]}s")
        time.sleep(0.05)
"""


def wait_port_open(host: Host, port: int, timeout: float) -> None:
    """Wait until `port` on `host` takes connections, probing from inside the host: one
    process that retries (a Python start per probe cost seconds of CPU while Ray starts)."""
    probe = subprocess.run(host.command(sys.executable, "-c", PROBE, host.address, str(port),
                                        str(timeout)), capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr


def test_hosts_that_share_nothing_train_across_the_link_with_curve(
        processes: Processes, tmp_path: Path) -> None:
    home = tmp_path / "host"
    run_dir, checkpoints = home / "run", home / "checkpoints"
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    with hosts(3) as plain:
        controller_host, learner_host, stranger_host = own_disks(
            plain, [home, Path("/tmp/ray"), Path.home() / ".ray"], tmp_path / "disks")
        ray_node(processes, controller_host, tmp_path, controller_host, env)
        wait_port_open(controller_host, RAY_PORT, 60)  # the Ray head
        ray_node(processes, learner_host, tmp_path, controller_host, env)
        args = [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--backend", "ray",
                "--ray-address", f"{controller_host.address}:{RAY_PORT}", "--run-dir",
                str(run_dir), "--quiet"]
        for override in (f"ray.actor={{CPU: 1, {controller_host.namespace}: 1}}",
                         f"ray.learner={{CPU: 1, {learner_host.namespace}: 1}}",
                         f"ray.inference={{CPU: 1, {learner_host.namespace}: 1}}",
                         f"checkpoint.dir={checkpoints}", "checkpoint.interval_s=0",
                         "checkpoint.every_updates=10", "runtime.restart_backoff_s=0",
                         "stop.target_return=null", "stop.wall_time_s=600"):
            args += ["--set", override]
        launch = processes.start(controller_host.command(*args), log=tmp_path / "launch.log",
                                 env=env)
        runs = controller_host.outside(run_dir)  # the run directory, on the controller's host
        endpoint = wait_for(lambda: advertised(runs, SAMPLES.key(index=0)), 180,
                            "the learner's sample stream")
        stranger = processes.start(stranger_host.command(sys.executable, "-c", STRANGER,
                                                         endpoint), log=tmp_path / "stranger.log")
        wait_for(lambda: last_row(runs).get("system/auth_refused", 0) >= 1, 120,
                 "the stranger refused")
        Processes.kill(stranger.pid)
        assert "stranger sent" in (tmp_path / "stranger.log").read_text()

        saved = learner_host.outside(checkpoints)
        wait_for(lambda: steps_in(saved), 120, "a checkpoint on the learner's host")
        victim = worker(read_status(runs), "learner-0")["pid"]
        Processes.kill(victim)
        newest = max(steps_in(saved))
        wait_restarted(runs, "learner-0", victim, 120)
        restored = wait_for(lambda: RESTORED.search((runs / "logs" / "learner-0.log")
                                                    .read_text()), 120, "the restore")
        step = int(restored.group(1))
        # Updates on the actor host's frames past the restored step, then Ctrl-C. Past the
        # dead learner's last report too: rows hold it until the successor reports, and it
        # may lie past its newest checkpoint (a row of it once ended the wait, and the last
        # row, the successor's, still showed the restored step).
        held = max(row["learner_steps"] for row in read_metrics(runs))
        rows = stop_when(launch, runs, lambda row: row["system/learner_restarts"] >= 1
                         and row["learner_steps"] > max(step, held), 120,
                         tmp_path / "launch.log")

    assert step == newest > 0, "the restarted learner restored its newest step"
    # From the kill on: the dead learner's last report (held), then the restored one's.
    after = [row["learner_steps"] for row in rows if row["system/learner_restarts"] >= 1]
    assert min(after) >= min(after[0], step), f"the version went on from {step}: {after}"
    assert rows[-1]["learner_steps"] > step and rows[-1]["env_frames"] > 0
    assert rows[-1]["system/auth_refused"] >= 1, "the stranger was refused and counted"
    assert rows[-1]["system/wire_rejected"] == 0, "nothing of the stranger's was read"
    assert rows[-1]["inference/shm_frac"] == 0 and rows[-1]["actor/shm_mib"] == 0, \
        "the streams between hosts went on ZeroMQ, not shared memory"
    status = read_status(runs)
    assert status["state"] == "interrupted", status
    placed = {w["name"]: w["host"] for w in status["workers"]}
    assert placed == {"learner-0": learner_host.address, "inference-0": learner_host.address,
                      "actor-0": controller_host.address, "actor-1": controller_host.address}
    ports = [(controller_host.address, p) for p in status["ports"]] + [
        (w["host"], p) for w in status["workers"] for p in w["ports"]]
    ports = [(host, p) for host, p in ports if p["key"].startswith("port.")]  # ZMQ's
    assert sorted(p["key"] for _, p in ports) == sorted([
        "port.changes", "port.names", "port.logs", "port.stats", "port.samples.0", "port.params",
        "port.inference.0"]), "names and logs are the controller's (runtime.names: auto)"
    for host, port in ports:
        assert port["authenticated"] and port["bind"].startswith(host), port
    for name in placed:  # every line once, through the log stream
        log = (runs / "logs" / f"{name}.log").read_text()
        starts = 2 if name == "learner-0" else 1  # the killed one never said 'stopped'
        assert log.count(": running\n") == starts and log.count(": stopped\n") == 1, (name, log)
    # Each host holds only its own: the run directory the controller's, the checkpoints
    # the learner's; the learner's host has no more of the run than its workers' scratch.
    assert [p.name for p in controller_host.outside(home).iterdir()] == ["run"]
    assert not (runs / "checkpoints").exists() and steps_in(saved)
    scratch = learner_host.outside(run_dir)
    assert not {"config.yaml", "status.json", "metrics.jsonl", "names"} & {
        p.name for p in scratch.iterdir()}, sorted(scratch.iterdir())
    assert not any(stranger_host.outside(home).iterdir()), "the stranger has nothing"
    fps = statistics.median(r["fps"] for r in rows if r["env_frames"] > 0)
    print(f"hosts sharing nothing, with CURVE: median {fps:,.0f} env frames/s over "
          f"{rows[-1]['time']:.1f}s")
