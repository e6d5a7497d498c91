"""Where a cluster script's workers land, worked out before anything is written.

Each host offers its role's custom resources (`srl_jax.cluster.roles`) and the CPUs,
GPUs or TPU chips the layout gives it; each worker asks what its `ray.<kind>` key on the
script's launch line says. Placed in the run's worker order, each on the first host
with room, as Ray finds room for resource asks of one unit each. A worker with no room,
or a launch line the launcher would refuse (it goes through the launcher's own checks
here, `srl_jax.launch.launch_line_checks`), stops the generator with one line; the dry
run (`--dry-run`) prints the plan instead of the script.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.worker_kinds import worker_kind, worker_plan
from srl_jax.wire.names import worker_name

CPU = "CPU"
"""A host whose offer has no CPU figure (a VM whose cores Ray counts when it starts) takes
any number of one-CPU asks here."""
SCRIPT_ENV = {"RAY_AUTH_MODE": "token"}
"""What both scripts set for the run: Ray's token authentication."""


@dataclass(frozen=True)
class Host:
    name: str
    offer: dict[str, float]
    """What its Ray node offers: custom resources, and CPU, GPU, TPU where the layout
    knows them."""
    note: str = ""


@dataclass
class HostPlan:
    """A script's hosts, its launch line, and where each worker lands."""

    hosts: list[Host]
    launch: list[str]
    """`python -m srl_jax.launch ...`, before the script's `--ray-address`."""
    workers: dict[str, list[tuple[str, dict[str, float]]]] = field(default_factory=dict)
    """By host name: (worker, what it asks), once `place` ran."""


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{key} {amount:g}" for key, amount in resources.items())


def place(plan: HostPlan, config: ExperimentConfig) -> None:
    """Put every worker of `config` (the launch line's, its `ray.<kind>` asks set) on the
    first host with room, or raise ConfigError naming the first that has none."""
    left = [dict(host.offer) for host in plan.hosts]
    plan.workers = {host.name: [] for host in plan.hosts}
    for kind, index, policy in worker_plan(config):
        ask = worker_kind(kind).ray_resources(config)
        name = worker_name(kind, index, policy)
        at = next((i for i, f in enumerate(left) if all(
            amount <= f.get(key, 0.0 if key != CPU or CPU in f else amount)
            for key, amount in ask.items())), None)
        if at is None:
            role = next((key for key in ask if key.endswith("_host")), CPU)
            room = "; ".join(f"{host.name} {_amounts(f)}"
                             for host, f in zip(plan.hosts, left, strict=True)
                             if role in host.offer) or f"no host offers {role}"
            raise ConfigError(f"{name} cannot be placed: it asks {_amounts(ask)}, and what "
                              f"the hosts have left is: {room}")
        for key, amount in ask.items():
            if key in left[at]:
                left[at][key] = round(left[at][key] - amount, 4)
        plan.workers[plan.hosts[at].name].append((name, ask))


def check_launch(plan: HostPlan, address: str) -> ExperimentConfig:
    """The launch line through the launcher's own checks, as the script will run it (with
    `--ray-address`), then every worker placed; returns the config the run will have."""
    from srl_jax.launch import launch_line_checks  # the launcher's imports: only here

    try:
        launched = launch_line_checks([*plan.launch[3:], f"--ray-address={address}"],
                                      SCRIPT_ENV)
    except ConfigError as error:
        raise ConfigError(f"the launcher would refuse the script's launch line: {error}") \
            from None
    place(plan, launched)
    return launched


def describe(plan: HostPlan, what: str) -> str:
    """The dry run: every host with what it offers, the workers it runs and what each
    asks, then the launch line."""
    workers = sum(len(placed) for placed in plan.workers.values())
    lines = [f"# {what}: {len(plan.hosts)} hosts, {workers} workers"]
    width = max((len(name) for placed in plan.workers.values() for name, _ in placed),
                default=0)
    for host in plan.hosts:
        note = f" ({host.note})" if host.note else ""
        lines.append(f"{host.name}{note}: offers {_amounts(host.offer)}")
        lines += [f"  {name:<{width}}  asks {_amounts(ask)}"
                  for name, ask in plan.workers[host.name]]
    lines += ["# the run (the launcher's checks passed on it):",
              " ".join([plan.launch[0], shlex.join(plan.launch[1:]), "--ray-address=HEAD:PORT"])]
    return "\n".join(lines) + "\n"
