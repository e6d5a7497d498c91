"""Device placement: which platform, devices and share of device memory each worker gets.

Every JAX process on a GPU preallocates 75% of each GPU it sees, and only one process
may open a TPU, so a run of several JAX workers on one accelerator host needs a plan.
`describe_host` (srl_jax/runtime/host_devices.py) reads what this host has without importing
JAX; `plan_placement` turns the config's placement keys and that
description into one `WorkerPlacement` per worker, pure and testable from a described
device list; the controller adds each worker's `env` to its environment before the
process imports JAX (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS, XLA_*), and
writes the plan to `status.json`. A plan that cannot work is a `PlacementError`: one
line, exit code 2 at launch.

The automatic rule (every key `auto`, the default):
- no accelerator: everything on the CPU, as `learner.devices` says;
- one GPU: the learner and the servers (inference servers, evaluator) share it;
- N GPUs: the learner on the most of the first N - max(1, N // 4) GPUs that its batch
  splits over evenly, the servers in turn on the GPUs the learner leaves;
- a TPU host: the learner owns the TPU; the servers and the evaluator run on the CPU.
A device's memory is split by role: with learners and servers on it, the learners
share 0.6 of it and the servers 0.3; with one role only, that role shares 0.9. The
rest is left for each process's CUDA context.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.worker_kinds import worker_kind, worker_plan
from srl_jax.runtime.host_devices import HostDevices
from srl_jax.wire.names import worker_name

LEARNER_DEVICES_ENV = "SRL_JAX_LEARNER_DEVICES"
"""The learner's devices as indices into its own `jax.local_devices()` (comma-separated)."""
AUTO, CPU, ON_DEMAND = "auto", "cpu", "on_demand"
SHARED_LEARNER_SHARE = 0.6
"""Auto: what the learners of a device share when servers use it too."""
SHARED_SERVER_SHARE = 0.3
"""Auto: what the servers of a device share when learners use it too."""
ALONE_SHARE = 0.9
"""Auto: what one role's processes share of a device they have to themselves."""
MEM_FRACTION_ENV = "XLA_CLIENT_MEM_FRACTION"
"""The share of each visible GPU's memory a JAX process preallocates."""
DEPRECATED_MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
"""Its name before jaxlib 0.11 deprecated it."""
JAX_PLATFORM_NAMES = {"cpu": "cpu", "gpu": "cuda,cpu", "tpu": "tpu,cpu"}
"""JAX_PLATFORMS of a worker on each platform (the CPU too: host-side arrays)."""


class PlacementError(ConfigError):
    """A placement that cannot work on this host; the message is one line."""


@dataclass(frozen=True)
class WorkerPlacement:
    platform: str
    """Where its JAX runs: 'cpu', 'gpu' or 'tpu'."""
    devices: tuple[int, ...] = ()
    """Device ids of the host description (empty on the CPU, or where Ray chooses)."""
    memory: float | str = ""
    """Share of each of its devices' memory it may take: a fraction, 'on_demand', or ''
    where the platform has no such setting (CPU, TPU)."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the worker's environment before it starts."""
    role: str = ""
    """'learner', 'server', or '' for a worker that puts nothing on a device."""
    kind: str = ""


@dataclass(frozen=True)
class Placement:
    host: HostDevices
    workers: dict[str, WorkerPlacement]
    """By worker name (`srl_jax.wire.names.worker_name`)."""
    backend: str = "local"

    def env(self, worker: str) -> dict[str, str]:
        placed = self.workers.get(worker)
        return dict(placed.env) if placed else {}

    def to_json(self) -> dict[str, Any]:
        """For status.json: the host and each worker's platform, devices and memory share."""
        return {"backend": self.backend, "host": asdict(self.host),
                "workers": {name: {"platform": p.platform, "devices": list(p.devices),
                                   "memory": p.memory}
                            for name, p in self.workers.items()}}

    def lines(self) -> list[str]:
        """The plan as printed at launch: one line per device worker, then the rest."""
        host = ("devices chosen by Ray per worker (ray.<kind> resources)"
                if self.backend == "ray" else self.host.text())
        lines = [f"placement: {host}"]
        rest: dict[str, int] = {}
        for name, placed in self.workers.items():
            if not placed.role:
                rest[placed.kind] = rest.get(placed.kind, 0) + 1
                continue
            devices = ",".join(map(str, placed.devices)) or (
                "Ray's" if self.backend == "ray" and placed.platform != "cpu" else "")
            where = f"{placed.platform} {devices}".strip()
            memory = (f"memory {placed.memory:.2f}" if isinstance(placed.memory, float)
                      else f"memory {placed.memory}" if placed.memory else "")
            lines.append(f"  {name:<28} {where:<14} {memory}".rstrip())
        if rest:
            lines.append("  " + ", ".join(f"{kind} x{n}" for kind, n in rest.items())
                         + ": cpu")
        return lines


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class _Want:
    """One device worker's request, as the config states it."""

    name: str
    kind: str
    role: str
    device_key: str
    """The config key that places it, for error lines."""
    device: str | int | list[int]
    """learner: a count or a list; servers: 'auto', 'cpu' or an id."""
    memory: float | str
    memory_key: str


def _wants(config: ExperimentConfig) -> tuple[list[_Want], dict[str, str]]:
    """The device workers' requests in plan order, and the other workers' kinds by name."""
    wants, others = [], {}
    for kind, index, policy in worker_plan(config):
        name = worker_name(kind, index, policy)
        section = worker_kind(kind).devices_section(config)
        if not section:
            others[name] = kind
        elif section == "learner":
            wants.append(_Want(name, kind, "learner", "learner.devices", config.learner.devices,
                               config.learner.device_memory, "learner.device_memory"))
        else:
            keys = getattr(config, section)
            wants.append(_Want(name, kind, "server", f"{section}.device", keys.device,
                               keys.device_memory, f"{section}.device_memory"))
    return wants, others


def _ids(values: Sequence[int]) -> str:
    return ",".join(map(str, values))


def _memory_env(memory: float | str) -> dict[str, str]:
    """A GPU worker's memory share. jaxlib 0.11 and 0.12 read MEM_FRACTION_ENV and raise
    when the deprecated name is set too, so a deprecated one the launcher inherited is
    blanked (jaxlib takes an empty value for unset)."""
    if memory == ON_DEMAND:
        return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    return {MEM_FRACTION_ENV: f"{memory:g}", DEPRECATED_MEM_FRACTION_ENV: ""}


def _on_cpu(kind: str, role: str = "") -> WorkerPlacement:
    """A worker kept off every accelerator (JAX_PLATFORMS=cpu: it never opens one)."""
    return WorkerPlacement(CPU, env={"JAX_PLATFORMS": "cpu"}, role=role, kind=kind)


def _check_ids(want: _Want, ids: Sequence[int], host: HostDevices) -> None:
    for i in ids:
        if not 0 <= i < host.count:
            what = (f"{host.count} {host.platform} device(s)" if host.platform != "cpu"
                    else f"no accelerator and {host.count} CPU device(s)")
            raise PlacementError(f"'{want.device_key}': device {i} does not exist: this host "
                                 f"has {what} (ids 0..{host.count - 1})")


def _divisor_at_most(limit: int, batch: int) -> int:
    """The most devices, up to `limit`, that a batch of `batch` columns splits over evenly."""
    return max(d for d in range(1, max(1, limit) + 1) if batch % d == 0)


def _learner_devices(want: _Want, host: HostDevices, pool: list[int], index: int,
                     learners: int, batch: int) -> tuple[int, ...]:
    """A learner process's devices: the listed ones, or a count of the pool (by default
    the most of its part of the pool that its `batch` share splits over evenly), split
    among the host's learner processes (which share devices only when too few)."""
    if isinstance(want.device, list):
        _check_ids(want, want.device, host)
        pool, count = list(want.device), max(1, len(want.device) // learners)
    elif isinstance(want.device, str):
        raise PlacementError(f"'{want.device_key}' must be a count or a list of device ids, "
                             f"got '{want.device}'")
    else:
        if want.device > host.count:
            raise PlacementError(f"'{want.device_key}' is {want.device} but this host has "
                                 f"{host.count} {host.platform} device(s)")
        count = want.device or _divisor_at_most(len(pool) // learners, batch)
        if count > len(pool):  # more than the rule leaves the learners: take what is asked
            pool = list(range(host.count))
    return tuple(pool[(index * count + j) % len(pool)] for j in range(count))


def _memory_share(want: _Want, devices: Sequence[int], users: dict[int, dict[str, int]]
                  ) -> float | str:
    """The worker's share: as configured, else the tightest of its role's auto shares."""
    if want.memory != AUTO:
        return want.memory
    shares = []
    for d in devices:
        both = len(users[d]) > 1
        budget = ALONE_SHARE if not both else (
            SHARED_LEARNER_SHARE if want.role == "learner" else SHARED_SERVER_SHARE)
        shares.append(budget / users[d][want.role])
    return math.floor(min(shares) * 1000) / 1000


def _gpu_plan(config: ExperimentConfig, host: HostDevices, wants: list[_Want]
              ) -> dict[str, WorkerPlacement]:
    learners = [w for w in wants if w.role == "learner"]
    servers = [w for w in wants if w.role == "server"]
    for w in servers:
        if isinstance(w.device, int):
            _check_ids(w, [w.device], host)
    pinned = {w.device for w in servers if isinstance(w.device, int)}
    pool = [i for i in range(host.count) if i not in pinned] or list(range(host.count))
    if any(w.device == AUTO for w in servers) and len(pool) >= 2:
        pool = pool[:len(pool) - max(1, len(pool) // 4)]
    batch = config.learner.batch_envs // config.learner.processes
    devices = {w.name: _learner_devices(w, host, pool, i, len(learners), batch)
               for i, w in enumerate(learners)}
    used = {d for ids in devices.values() for d in ids}
    server_pool = [i for i in range(host.count) if i not in used] or [max(used, default=0)]
    auto = 0
    for w in servers:
        if w.device == CPU:
            devices[w.name] = ()
        elif isinstance(w.device, int):
            devices[w.name] = (w.device,)
        else:
            devices[w.name], auto = (server_pool[auto % len(server_pool)],), auto + 1
    users: dict[int, dict[str, int]] = {i: {} for i in range(host.count)}
    for w in wants:
        for d in devices[w.name]:
            users[d][w.role] = users[d].get(w.role, 0) + 1
    placed = {}
    for w in wants:
        ids = devices[w.name]
        if not ids:
            placed[w.name] = _on_cpu(w.kind, w.role)
            continue
        memory = _memory_share(w, ids, users)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(host.visible[d] for d in ids),
               "JAX_PLATFORMS": JAX_PLATFORM_NAMES["gpu"]}
        env.update(_memory_env(memory))
        if w.role == "learner":
            env[LEARNER_DEVICES_ENV] = _ids(range(len(ids)))
        placed[w.name] = WorkerPlacement("gpu", ids, memory, env, w.role, w.kind)
    _check_memory(placed, wants, host)
    return placed


def _check_memory(placed: dict[str, WorkerPlacement], wants: list[_Want],
                  host: HostDevices) -> None:
    """Refuse a device whose processes' shares add up to more than all of it."""
    keys = {w.name: w.memory_key for w in wants}
    for d in range(host.count):
        on = [(name, p.memory) for name, p in placed.items()
              if d in p.devices and isinstance(p.memory, float)]
        total = sum(share for _, share in on)
        if total > 1.0 + 1e-9:
            parts = ", ".join(f"{name} {share:g}" for name, share in on)
            lower = " or ".join(sorted({repr(keys[name]) for name, _ in on}))
            raise PlacementError(
                f"device memory shares of {host.platform} {d} add up to {total:.2f} ({parts}): "
                f"lower {lower}, or make one 'on_demand'")


def _single_device_plan(config: ExperimentConfig, host: HostDevices, wants: list[_Want]
                        ) -> dict[str, WorkerPlacement]:
    """CPU hosts and TPU hosts: the learner takes the host's devices (every learner
    process on a CPU has its own), the servers run on the CPU."""
    learners = [w for w in wants if w.role == "learner"]
    if host.platform == "tpu" and len(learners) > 1:
        raise PlacementError(
            f"a TPU host is opened by one process, but this run has {len(learners)} learner "
            "processes (policies x 'learner.processes'): run one learner per TPU host")
    placed = {}
    for w in wants:
        if w.role == "server":
            if isinstance(w.device, int):
                raise PlacementError(
                    f"'{w.device_key}' is {w.device}, but " + (
                        "only one process may open a TPU, the learner's: use cpu or auto"
                        if host.platform == "tpu" else
                        "this host has no accelerator: use cpu or auto"))
            placed[w.name] = _on_cpu(w.kind, w.role)
            continue
        ids = _learner_devices(w, host, list(range(host.count)), 0, 1,
                               config.learner.batch_envs // config.learner.processes)
        env = {"JAX_PLATFORMS": JAX_PLATFORM_NAMES[host.platform],
               LEARNER_DEVICES_ENV: _ids(ids)}
        placed[w.name] = WorkerPlacement(host.platform, ids, "", env, w.role, w.kind)
    return placed


def _ray_plan(config: ExperimentConfig, wants: list[_Want]) -> dict[str, WorkerPlacement]:
    """Ray chooses each worker's devices from its `ray.<kind>` resources; the plan adds
    the platform and a memory share in proportion to the GPU fraction asked for."""
    placed = {}
    for w in wants:
        if isinstance(w.device, list) or (w.role == "server" and isinstance(w.device, int)):
            raise PlacementError(f"'{w.device_key}': with --backend ray, Ray chooses the "
                                 "devices; ask for them in 'ray.<kind>' ({GPU: 1}) instead")
        kind = w.kind
        resources = worker_kind(kind).ray_resources(config)
        gpus, tpus = resources.get("GPU", 0.0), resources.get("TPU", 0.0)
        if w.device == CPU or not (gpus or tpus):
            if w.device == CPU and (gpus or tpus):
                raise PlacementError(f"'{w.device_key}' is cpu but 'ray.{kind}' asks for "
                                     f"{resources}")
            placed[w.name] = _on_cpu(w.kind, w.role)
        elif tpus:
            placed[w.name] = WorkerPlacement("tpu", role=w.role, kind=w.kind)
        else:
            memory = w.memory if w.memory != AUTO else round(ALONE_SHARE * min(1.0, gpus), 3)
            env = {"JAX_PLATFORMS": JAX_PLATFORM_NAMES["gpu"]}
            env.update(_memory_env(memory))
            placed[w.name] = WorkerPlacement("gpu", (), memory, env, w.role, w.kind)
    return placed


def plan_placement(config: ExperimentConfig, host: HostDevices,
                   backend: str = "local") -> Placement:
    """Each worker's platform, devices, memory share and environment; PlacementError
    (one line) where the config asks for what `host` cannot give."""
    wants, others = _wants(config)
    if backend == "ray":
        placed = _ray_plan(config, wants)
    elif host.platform == "gpu":
        placed = _gpu_plan(config, host, wants)
    else:
        placed = _single_device_plan(config, host, wants)
    for want in wants:
        devices = len(placed[want.name].devices)
        local_envs = config.learner.batch_envs // config.learner.processes
        if want.role == "learner" and devices and local_envs % devices:
            raise PlacementError(
                f"'learner.batch_envs' ({config.learner.batch_envs}) must divide evenly over "
                f"the {devices * config.learner.processes} learner devices of the plan "
                f"({host.platform} {_ids(placed[want.name].devices)}): set 'learner.devices'")
    for name, kind in others.items():
        placed[name] = _on_cpu(kind)
    order = [worker_name(kind, index, policy) for kind, index, policy in worker_plan(config)]
    return Placement(host, {name: placed[name] for name in order}, backend)


def planned_learner_devices(environ: Mapping[str, str] | None = None) -> list[int] | None:
    """The learner's devices as indices into its `jax.local_devices()`, as the plan set
    them; None where no plan did (a learner built outside a run)."""
    value = (os.environ if environ is None else environ).get(LEARNER_DEVICES_ENV)
    return None if value is None else [int(i) for i in value.split(",") if i]
