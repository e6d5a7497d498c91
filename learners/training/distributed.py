"""Multi-process learners: one learner process per host, joined by jax.distributed.

With `learner.processes` > 1 the controller starts that many learner workers;
worker i is JAX process i. Each binds its own sample stream (actors spread
their chunks over all of them), fills its local B / processes env columns,
and the global batch is assembled with `jax.make_array_from_process_local_data`.
The update then runs over the devices of every process; only process 0
publishes parameters.

Where the coordinator is, how many processes there are and which one this is
come from the config (`learner.coordinator_address`, `learner.processes`, the
worker index), or from the environment (SRL_JAX_COORDINATOR_ADDRESS,
SRL_JAX_NUM_PROCESSES, SRL_JAX_PROCESS_ID), which wins. With no address given,
process 0 picks a free port and registers it in the name service: on loopback,
since the coordinator (gRPC) has no authentication, unless the config lets it
listen on the network (`transport.allow_unauthenticated`, for learners on
several hosts; `srl_jax.config.checks` refuses such a run without it). The processes'
collectives (gloo on CPU, NCCL on GPU) listen where the coordinator does
(learners/training/collectives.py).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from learners.training.collectives import pin_gloo, pin_nccl
from srl_jax.config.schema import ExperimentConfig

ENV_COORDINATOR = "SRL_JAX_COORDINATOR_ADDRESS"
ENV_PROCESSES = "SRL_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "SRL_JAX_PROCESS_ID"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ProcessLayout:
    coordinator: str
    """host:port of process 0's coordinator service ('' until known)."""
    count: int
    index: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def process_layout(config: ExperimentConfig, worker_index: int,
                   environ: dict[str, str] | None = None) -> ProcessLayout:
    env = os.environ if environ is None else environ
    return ProcessLayout(
        coordinator=env.get(ENV_COORDINATOR, config.learner.coordinator_address),
        count=int(env.get(ENV_PROCESSES, config.learner.processes)),
        index=int(env.get(ENV_PROCESS_ID, worker_index)),
    )


def coordinator_host(config: ExperimentConfig, advertise_host: str) -> str:
    """Where process 0's coordinator and every process's collectives (gloo, NCCL) listen:
    loopback, or with `transport.allow_unauthenticated` the address peers on other hosts
    dial. None of them authenticates."""
    return advertise_host if config.transport.allow_unauthenticated else LOOPBACK


def free_address(host: str) -> str:
    """host:port with a port free on `host` now, for the jax.distributed coordinator."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"


def initialize(layout: ProcessLayout, host: str) -> None:
    """Join the other learner processes (none for a single process); JAX's collectives
    (NCCL, and gloo between processes) listen on `host` alone."""
    pin_nccl(host, os.environ)
    if layout.count == 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=layout.coordinator, num_processes=layout.count,
        process_id=layout.index,
        coordinator_bind_address=layout.coordinator if layout.is_chief else None,
        # Every parameter is given: no cluster detection, which under Slurm would also
        # narrow each process to the GPU of its SLURM_LOCALID.
        cluster_detection_method="deactivate")
    pin_gloo(host)


def agree(ready: bool, stopping: bool, save_due: bool) -> tuple[bool, bool, bool]:
    """(every process has a batch, some process is stopping, some process wants a
    checkpoint), agreed by all processes.

    The update and the checkpoint save are collectives: a process may enter
    one only when all will, and may leave the loop only when all do, or the
    others would wait forever.
    """
    flags = multihost_utils.process_allgather(np.array([ready, stopping, save_due], np.int32))
    flags = np.asarray(flags).reshape(-1, 3)
    return bool(flags[:, 0].all()), bool(flags[:, 1].any()), bool(flags[:, 2].any())


def gather_json(value: Any, max_bytes: int = 4096) -> list[Any]:
    """Every process's `value` (small and JSON-able), in process order.

    Sent as bytes: JAX without x64 would squeeze large counters into 32 bits.
    """
    data = json.dumps(value).encode()
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes of JSON is more than gather_json's {max_bytes}")
    buffer = np.zeros(max_bytes, np.uint8)
    buffer[:len(data)] = np.frombuffer(data, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(buffer)).reshape(-1, max_bytes)
    return [json.loads(bytes(row).rstrip(b"\0")) for row in rows]


def shutdown(layout: ProcessLayout) -> None:
    """Leave together: process 0 hosts the coordinator, so it must not go first."""
    if layout.count > 1 and jax.distributed.is_initialized():
        jax.distributed.shutdown()
