"""The config sections about operating a run rather than what it learns: checkpoints,
transport, Ray resources and the runtime's timing (srl_jax/config/schema.py composes them
into `ExperimentConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class CheckpointConfig:
    enabled: bool = True
    """Write orbax checkpoints of the learner (to `dir`)."""
    dir: str = ""
    """Where: '' for `<run_dir>/checkpoints/`, an absolute path on the learner's host, or
    a URI orbax writes to (gs://bucket/run, s3://bucket/run, file:///path)."""
    shared: bool = False
    """`dir` (or the run directory, where `dir` is '') is a file system every learner host
    mounts at the same path. Learner processes on several hosts need that or a bucket:
    only the first process writes a checkpoint, and after a restart every process restores it."""
    interval_s: float = 30.0
    """Seconds between checkpoints (0: not by time)."""
    every_updates: int = 0
    """Also checkpoint every this many learner updates (0: not by updates)."""
    keep: int = 3
    """Newest checkpoints kept; older ones are deleted."""
    keep_best: bool = True
    """Also keep the checkpoint with the best training return, under `checkpoints/best/`."""
    async_save: bool = True
    """Write in a background thread; the learner only waits for the copy off the devices."""
    final_save_timeout_s: float = 120.0
    """On stop, how long the controller waits for the learner's final checkpoint."""


@dataclass
class TransportConfig:
    bind_host: str = "127.0.0.1"
    """Interface every socket binds (a launch backend may give each worker its node's)."""
    advertise_host: str = ""
    """Address peers dial ('': the bind address, or this host's address for 0.0.0.0)."""
    curve: bool | None = None
    """ZMQ CURVE authentication and encryption. null: on unless bound to loopback;
    true (on): always; false (off): never, so a network port is open to whoever reaches
    it (only on a network you trust)."""
    allow_unauthenticated: bool = False
    """Let the ports that have no authentication of ours listen off loopback: the
    jax.distributed coordinator of learners on several hosts (gRPC, never authenticated)
    and a local Ray instance with token authentication turned off (RAY_AUTH_MODE=disabled).
    false: the coordinator binds loopback, and a config that would need it off loopback
    is refused (only on a network you trust)."""
    shared_memory: Literal["auto", "on", "off"] = "auto"
    """Inference requests, samples and inserts between workers of one host go through
    shared memory (/dev/shm) instead of ZeroMQ: auto (wherever they share a host and it
    has /dev/shm), on (as auto; a host without it is an error), off (ZeroMQ everywhere)."""


def _one_cpu() -> dict[str, float]:
    return {"CPU": 1.0}


@dataclass
class RayConfig:
    address: str = ""
    """The Ray cluster `--backend ray` joins ('': start a local Ray instance, sized to
    hold every worker); `--ray-address` overrides."""
    actor: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources each actor asks for: CPU, GPU, TPU or a node type's custom
    resource ({CPU: 1, actor_node: 1}). Likewise for the kinds below."""
    learner: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources each learner process asks for (a GPU or TPU learner: {GPU: 1} ...)."""
    inference: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources each inference server asks for."""
    evaluator: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources the evaluator asks for."""
    replay: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources each replay server asks for."""
    population: dict[str, float] = field(default_factory=_one_cpu)
    """Ray resources the population manager asks for (it needs no run directory: any node
    will do)."""
    placement_timeout_s: float = 120.0
    """How long a worker may wait for Ray to place it (no node has its resources free):
    past it a learner ends the run, any other worker is reported missing ('waiting for
    capacity' in status.json) while the run goes on without it, until a node joins."""


@dataclass
class RuntimeConfig:
    log_interval_s: float = 1.0
    """Seconds between rows of metrics.jsonl (and status.json rewrites)."""
    stats_interval_s: float = 0.5
    """Seconds between a worker's heartbeats (which carry its counters)."""
    stats_queue: int = 64
    """Heartbeats queued per worker, each way (ZMQ high-water mark); a worker whose
    controller is behind skips heartbeats (each carries running totals) rather than grow."""
    heartbeat_timeout_s: float = 60.0
    """A worker silent this long is killed and restarted (start-up gets twice as long)."""
    busy_timeout_s: float = 1800.0
    """How long a worker blocked in slow device work (an XLA compile, a Nature-CNN
    update on a CPU) keeps heartbeating from a helper thread; past it,
    `heartbeat_timeout_s` applies again (0: never)."""
    max_restarts: int = 3
    """Restarts allowed per worker before the run fails."""
    restart_backoff_s: float = 1.0
    """Delay before the first restart; doubles with each restart of the same worker."""
    max_message_mb: float = 256.0
    """Largest message frame (one array) a worker or the controller accepts; a peer that
    sends a larger one is disconnected before anything is allocated."""
    stall_timeout_s: float = 60.0
    """With no new env frames and no learner step for this long, the controller logs
    who waits on what, again every as long while it lasts (0: never)."""
    stop_grace_s: float = 5.0
    """Seconds workers get to exit after SIGTERM before SIGKILL."""
    compilation_cache_dir: str = "~/.cache/srl_jax/jax"
    """JAX's persistent compilation cache: later runs and `srl_jax.evaluate` skip compiling
    ('' disables it)."""
    warm_parent: bool = True
    """Fork each host's learners, inference servers, evaluators and replay servers from
    one process that has imported JAX (srl_jax/runtime/hosts/warm_parent.py), started
    with the run; false: each starts as a fresh interpreter and imports JAX itself."""
    host_agents: bool = True
    """With the network name service on Ray, one host agent per node stands for that
    node's workers towards the controller (names, heartbeats, logs:
    srl_jax/runtime/hosts/host_agent.py), so that the controller's load grows with nodes, not
    workers. False: every worker is the controller's peer."""
    param_fanout: int = 8
    """With host agents, the most copies of each parameter version one sender makes for
    other hosts: the agents relay each policy's parameters to their hosts in a tree of
    this fan-out (srl_jax/runtime/hosts/param_relay.py), so the learner sends each
    version this many times whatever the number of hosts and subscribers."""
    names: str = "auto"
    """Where workers find each other's endpoints, their config and where their output goes:
    files (names as files under the run directory, each worker writes its own log
    there: every host must see that directory), network (the controller serves names
    and the config, and takes every worker's output into its run directory: hosts need
    share nothing but the network), or auto (network with `--backend ray` on a cluster
    given by address, files otherwise)."""
