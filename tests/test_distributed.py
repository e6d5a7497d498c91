"""Two learner processes joined by jax.distributed (CPU collectives), end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from learners.training.collectives import GLOO_KEY, listening_sockets
from learners.training.distributed import free_address, process_layout
from srl_jax.dataflow.stream_table import COORDINATOR
from srl_jax.runtime.run_dir import checkpoint_steps, read_status
from srl_jax.wire.transport import primary_address
from tests.conftest import (
    CARTPOLE_MARGIN,
    CARTPOLE_RANDOM_RETURN,
    Processes,
    assert_learned,
    descendants,
    ended_on_frames,
    make_config,
    wait_for,
)

FRAMES = 100_000
"""The two-learner run's frame budget: there the best mean return of 100 episodes was
290-345 (4 runs on 2 cores under others' load), 100-150 at 35,000 frames; it used to stop
at a return of 475."""


def test_layout_comes_from_config_or_environment() -> None:
    config = make_config(["learner.processes=2", "learner.coordinator_address=10.0.0.1:1234"])
    layout = process_layout(config, 1, environ={})
    assert (layout.coordinator, layout.count, layout.index) == ("10.0.0.1:1234", 2, 1)
    assert not layout.is_chief
    env = {"SRL_JAX_COORDINATOR_ADDRESS": "h:9", "SRL_JAX_NUM_PROCESSES": "4",
           "SRL_JAX_PROCESS_ID": "3"}
    layout = process_layout(config, 1, environ=env)
    assert (layout.coordinator, layout.count, layout.index) == ("h:9", 4, 3)


JOIN = """
import jax, sys
from learners.training.collectives import listening_sockets
from learners.training.distributed import ProcessLayout, initialize, shutdown
layout = ProcessLayout(sys.argv[1], 2, int(sys.argv[2]))
initialize(layout, "127.0.0.1")
print(jax.config.values['jax_cuda_visible_devices'], flush=True)
jax.devices()
print(",".join(sorted({host for host, _ in listening_sockets()})), flush=True)
shutdown(layout)
"""


def test_inside_a_slurm_step_each_process_keeps_every_gpu_of_its_host() -> None:
    """jax.distributed's Slurm detection would narrow each process to the GPU of its
    SLURM_LOCALID (jax_cuda_visible_devices); a learner is given all of its parameters,
    so no detection runs and it keeps its host's GPUs. And joined on loopback, the
    coordinator and gloo listen there alone."""
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node-a", "SLURM_NTASKS": "2",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "1"}
    address = free_address("127.0.0.1")
    joined = [subprocess.Popen([sys.executable, "-c", JOIN, address, str(i)],
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **slurm, "JAX_PLATFORMS": "cpu"})
              for i in (0, 1)]
    try:
        outputs = [p.communicate(timeout=120)[0].split() for p in joined]
    finally:
        for p in joined:
            p.kill()
    assert [p.returncode for p in joined] == [0, 0]
    assert outputs == [["all", "127.0.0.1"], ["all", "127.0.0.1"]]


@pytest.mark.slow
def test_two_learner_processes_learn_cartpole_on_the_devices_placed(
        processes: Processes, tmp_path: Path, s3_bucket: str) -> None:
    """They learn: the run stops on its frame budget, FRAMES, and 100 of its episodes beat
    random play by CARTPOLE_MARGIN. Also the placement plan end to end: each process
    has 4 CPU devices and trains on the two that `learner.devices` names; the server is
    placed on the CPU explicitly. And the opt-in to an unauthenticated coordinator and gloo
    off loopback, listed as such: while the run lives, every socket its processes listen
    on is in status.json, bound to the run's one interface (this host's address: gloo left
    alone binds what the host name resolves to, loopback here). Their checkpoints go to an
    s3:// bucket (an S3 server on loopback), a location both processes see, which the
    first alone writes."""
    run_dir, checkpoints = tmp_path / "run", f"{s3_bucket}/two-learners"
    address = primary_address()
    process = processes.start(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir", str(run_dir),
         "--set", "learner.processes=2", "--set", "stop.target_return=null",
         "--set", f"stop.env_frames={FRAMES}",
         # 16-env chunks, so the learner batch of 32 splits over the 2 processes. One actor:
         # the test is about the learners, and a second actor's frames mostly go unused.
         "--set", "actors.count=1", "--set", "actors.splits=4", "--set", "learner.devices=[1, 3]",
         "--set", "inference.device=cpu", "--set", f"transport.bind_host={address}",
         "--set", "transport.allow_unauthenticated=true",
         "--set", f"checkpoint.dir={checkpoints}"],
        log=tmp_path / "launch.log",
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    status = wait_for(lambda: (s := read_status(run_dir)) and all(
        w["state"] == "running" for w in s["workers"]) and all(
        any(p["key"] == GLOO_KEY for p in w["ports"]) for w in s["workers"]
        if w["kind"] == "learner") and s, 180, "both learners running, gloo listed")
    listed = {p["bind"]: p for p in [*status["ports"], *(
        p for w in status["workers"] for p in w["ports"])]}
    pids = {process.pid, *descendants(process.pid)}
    listening = {f"{host}:{port}" for pid in pids for host, port in listening_sockets(pid)}
    assert listening <= listed.keys(), f"not in status.json: {listening - listed.keys()}"
    assert {bind.rpartition(":")[0] for bind in listening} == {address}
    # the launcher, its warm parent (which listens on no port), 2 learners, a server, an actor
    assert len(pids) == 6 and len(listening) == len(listed), (pids, listening, listed)
    rows, status = ended_on_frames(process, run_dir, FRAMES, tmp_path / "launch.log")
    assert_learned(rows, CARTPOLE_RANDOM_RETURN, CARTPOLE_MARGIN)
    assert checkpoint_steps(run_dir, location=checkpoints)[-1] == rows[-1]["learner_steps"], \
        "the final save, in the bucket"
    logs = {i: (run_dir / "logs" / f"learner-{i}.log").read_text() for i in (0, 1)}
    assert "JAX process 0 of 2" in logs[0] and "JAX process 1 of 2" in logs[1]
    assert "on 4 device(s)" in logs[0], "the mesh spans both processes' placed devices"
    launched = (tmp_path / "launch.log").read_text()
    assert "placement: no accelerator: CPU (4 forced host devices)" in launched
    placed = {w["name"]: (w["platform"], w["devices"]) for w in status["workers"]}
    assert placed["learner-0"] == placed["learner-1"] == ("cpu", [1, 3])
    assert placed["inference-0"] == ("cpu", [])
    assert status["placement"]["host"]["count"] == 4
    assert status["placement"]["workers"]["learner-1"]["devices"] == [1, 3]
    learners = [w for w in status["workers"] if w["kind"] == "learner"]
    assert [w["exit_code"] for w in learners] == [0, 0], "both leave cleanly"
    coordinator = [p for p in learners[0]["ports"] if p["key"] == COORDINATOR.key()]
    assert len(coordinator) == 1 and coordinator[0]["authenticated"] is False, \
        "status.json lists the jax.distributed port, unauthenticated as it is"
    assert not coordinator[0]["bind"].startswith("127."), "opted in: on the network"
    gloo = [p for w in learners for p in w["ports"] if p["key"] == GLOO_KEY]
    assert len(gloo) == 2 and not any(p["authenticated"] for p in gloo), gloo
    assert all(p["authenticated"] for p in status["ports"]), "CURVE on the rest"
