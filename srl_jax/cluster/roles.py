"""What the cluster scripts ask of Ray: each host's custom resources by role, and each
worker kind's request for them (`ray.<kind>`), so that Ray puts one learner process on
every learner host and the servers and actors on theirs.

Every worker kind asks for one unit of its host role's resource (`learner_host`,
`inference_host`, `actor_host`); a host offers as many units as its share of those
workers. The learner is the exception that matters: a learner host offers exactly one
`learner_host`, so learner processes never share a host, and the other kinds of the
learner role (replay servers, the population manager) get resources of their own
(`replay_host`, ...) so that they do not take the learner's unit.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from dataclasses import dataclass

from srl_jax.config.schema import ExperimentConfig
from srl_jax.core.worker_kinds import HOST_ROLES, KINDS, WorkerKind, worker_kind, worker_plan

RAY_CLI = ("-m", "ray.scripts.scripts")
"""Ray's command line through the interpreter, so no PATH is needed on the hosts."""
LEARNER_RESOURCE = "learner_host"


def resource_name(kind: WorkerKind) -> str:
    """The custom resource a worker of `kind` asks one unit of."""
    if kind.host_role == "learner" and kind.name != "learner":
        return f"{kind.name}_host"
    return f"{kind.host_role}_host"


@dataclass(frozen=True)
class Roles:
    """How many hosts of each role, and what each offers Ray."""

    hosts: dict[str, int]
    """By role; 0 inference hosts: the inference servers run on the learner hosts."""
    slots: dict[str, dict[str, int]]
    """By role: each of its resources, in units per host of the role that serves it."""

    def offers(self, role: str) -> dict[str, int]:
        """Custom resources a host of `role` starts Ray with."""
        offer = dict(self.slots[role])
        if role == "learner" and not self.hosts["inference"]:
            offer.update(self.slots["inference"])
        return offer

    @property
    def servers_per_host(self) -> int:
        return self.slots["inference"].get("inference_host", 0)


def plan_roles(config: ExperimentConfig, inference_hosts: int, actor_hosts: int) -> Roles:
    hosts = {"learner": config.learner.processes, "inference": inference_hosts,
             "actor": actor_hosts}
    counts = Counter(worker_kind(kind).name for kind, _, _ in worker_plan(config))
    slots: dict[str, dict[str, int]] = {role: {} for role in HOST_ROLES}
    for name, count in counts.items():
        kind = worker_kind(name)
        serving = hosts[kind.host_role] or hosts["learner"]
        units = 1 if name == "learner" else math.ceil(count / max(serving, 1))
        slots[kind.host_role][resource_name(kind)] = units
    slots["learner"].setdefault(LEARNER_RESOURCE, 1)
    return Roles(hosts, slots)


def _amount(value: float) -> str:
    return f"{value:g}"


def placement_overrides(accelerators: dict[str, dict[str, float]] | None = None
                        ) -> list[str]:
    """`--set` values that send each kind of worker (with a `ray.<kind>` key) to hosts of
    its role; `accelerators` adds, by kind, what each worker asks besides
    (`{"learner": {"TPU": 4}}`; per worker, not per host)."""
    accelerators = accelerators or {}

    def ask(kind: WorkerKind) -> str:
        resources = {"CPU": 1.0, **accelerators.get(kind.name, {}), resource_name(kind): 1}
        return "{" + ", ".join(f"{k}: {_amount(v)}" for k, v in resources.items() if v) + "}"

    return [f"ray.{kind.name}={ask(kind)}" for kind in KINDS.values() if kind.ray_configured]


def share(total: float, workers: int) -> float:
    """Each of `workers`' part of `total` devices, to Ray's precision (1e-4), never more
    than the total between them."""
    return math.floor(total / max(workers, 1) * 10_000) / 10_000


def launch_args(python: str, experiment: str, run_dir: str, overrides: list[str]) -> list[str]:
    """The run's command, after `--ray-address ADDRESS` is added by the script."""
    args = [python, "-m", "srl_jax.launch", experiment, "--backend", "ray", "--run-dir",
            run_dir, "--quiet"]
    for override in overrides:
        args += ["--set", override]
    return args


def ray_offer(resources: dict[str, float]) -> str:
    """`--resources=...` as one shell word."""
    return shlex.quote("--resources=" + ", ".join(
        f'"{k}": {_amount(v)}' for k, v in resources.items()).join("{}"))
