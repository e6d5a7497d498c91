"""What the cluster scripts ask of Ray: each host's custom resources by role, and each
worker kind's request for them (`ray.<kind>`), so that Ray puts the learners on the
learner hosts and the servers and actors on theirs.

Every worker kind asks for one unit of its host role's resource (`learner_host`,
`inference_host`, `actor_host`); a host offers as many units as its share of those
workers. A learner host offers one `learner_host` per learner process it runs: one
with a single trained policy (a process of each of its `learner.processes` per host),
more with several policies or population members, which share the host's GPUs
(`share`). The other kinds of the learner role (replay servers, the population
manager) get resources of their own (`replay_host`, ...) so that they do not take a
learner's unit.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.worker_kinds import HOST_ROLES, KINDS, WorkerKind, worker_kind, worker_plan

RAY_CLI = ("-m", "ray.scripts.scripts")
"""Ray's command line through the interpreter, so no PATH is needed on the hosts."""


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


def learners_per_host(config: ExperimentConfig, learner_hosts: int) -> int:
    """How many learner processes each of `learner_hosts` runs (and so shares its GPUs
    between)."""
    learners = sum(1 for kind, _, _ in worker_plan(config) if kind == "learner")
    return math.ceil(learners / max(learner_hosts, 1))


def role_counts(config: ExperimentConfig) -> dict[str, Counter[str]]:
    """By host role: how many of the run's workers ask for each of its resources (kinds
    of a role share its resource: actors and the evaluator both ask for `actor_host`)."""
    counts: dict[str, Counter[str]] = {role: Counter() for role in HOST_ROLES}
    for name, _, _ in worker_plan(config):
        kind = worker_kind(name)
        counts[kind.host_role][resource_name(kind)] += 1
    return counts


def fewest_hosts(counts: Counter[str], cpus: int, at_least: int) -> int:
    """The fewest hosts, at least `at_least`, whose even shares of `counts`' workers (one
    CPU each) fit in `cpus` CPUs each; where none does, one per worker (then placement
    names the worker that does not fit)."""
    hosts = max(at_least, 1)
    while sum(math.ceil(c / hosts) for c in counts.values()) > cpus and \
            hosts < sum(counts.values()):
        hosts += 1
    return hosts


def plan_roles(config: ExperimentConfig, learner_hosts: int, inference_hosts: int,
               actor_hosts: int) -> Roles:
    hosts = {"learner": learner_hosts, "inference": inference_hosts, "actor": actor_hosts}
    slots: dict[str, dict[str, int]] = {role: {} for role in HOST_ROLES}
    for role, counts in role_counts(config).items():
        serving = hosts[role] or hosts["learner"]
        slots[role] = {resource: math.ceil(count / max(serving, 1))
                       for resource, count in counts.items()}
    return Roles(hosts, slots)


def _amount(value: float) -> str:
    return f"{value:g}"


def worker_asks(accelerators: dict[str, dict[str, float]] | None = None
                ) -> dict[str, dict[str, float]]:
    """What one worker of each kind (with a `ray.<kind>` key) asks Ray for: a CPU and a
    unit of its role's resource; `accelerators` adds, by kind, what each worker asks
    besides (`{"learner": {"TPU": 4}}`; per worker, not per host)."""
    accelerators = accelerators or {}
    return {kind.name: {k: v for k, v in {"CPU": 1.0, **accelerators.get(kind.name, {}),
                                          resource_name(kind): 1}.items() if v}
            for kind in KINDS.values() if kind.ray_configured}


def placement_overrides(asks: dict[str, dict[str, float]]) -> list[str]:
    """`--set` values that send each kind of worker to hosts of its role (`worker_asks`)."""
    return [f"ray.{name}={{" + ", ".join(f"{k}: {_amount(v)}" for k, v in ask.items()) + "}"
            for name, ask in asks.items()]


def share(total: float, workers: int) -> float:
    """Each of `workers`' part of `total` devices as Ray places it, never more than the
    total between them: whole devices (Ray refuses a fraction above 1), or 1/k of one, so
    that k share a device (to Ray's precision, 1e-4)."""
    part = total / max(workers, 1)
    if part >= 1:
        return float(math.floor(part))
    return math.floor(10_000 / math.ceil(1 / part - 1e-9)) / 10_000 if part > 0 else 0.0


def launch_args(python: str, experiment: str, run_dir: str, overrides: list[str]) -> list[str]:
    """The run's command, after `--ray-address ADDRESS` is added by the script."""
    args = [python, "-m", "srl_jax.launch", experiment, "--backend", "ray", "--run-dir",
            run_dir, "--quiet"]
    for override in overrides:
        args += ["--set", override]
    return args


def ray_offer(resources: Mapping[str, float]) -> str:
    """`--resources=...` as one shell word."""
    return shlex.quote("--resources=" + ", ".join(
        f'"{k}": {_amount(v)}' for k, v in resources.items()).join("{}"))
