"""The worker kinds of the dataflow and the run's worker plan, derived from the config here.

Each kind names its class as "module:Class", imported only in the process that
runs it (so an actor never imports JAX), says whether each policy has its own
workers of the kind, how many the config asks for, and which hosts of a cluster
script run it. The controller, the launch backends, the cluster scripts and
`python -m srl_jax.worker` all read this registry. A new kind (a population
worker) is its module, one `register_kind` call (its counters with it) and its
streams in the stream table; its Ray resources are `ray.<name>` where the config has that key.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

from srl_jax.config.operations import RayConfig
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ExperimentConfig,
    acting_policies,
    run_policies,
)
from srl_jax.dataflow.algorithms import reanalyses
from srl_jax.dataflow.metrics_table import (
    ACTOR,
    EVALUATOR,
    INFERENCE,
    LEARNER,
    POPULATION,
    REPLAY,
    Counter,
    metrics_markdown,
)

HOST_ROLES = ("learner", "inference", "actor")
"""The host roles of the cluster scripts (srl_jax/cluster/cli.py)."""
DEFAULT_RESOURCES = {"CPU": 1.0}
"""Ray resources of a kind the config has no `ray.<name>` key for."""
PARENT_ENV = "SRL_JAX_PARENT_PID"
"""The pid of the process that started a worker: the worker stops once its parent is
no longer that one, even if the parent died before the worker got to look."""
PARENT_PIDFD_ENV = "SRL_JAX_PARENT_PIDFD"
"""In a worker forked by a warm parent (srl_jax/runtime/hosts/warm_parent.py): an inherited
pidfd of the process that asked for it, which it watches in place of its parent's pid."""
EXIT_REFUSED = 2
"""Exit code of a worker that refuses what the run asks of it (a `ConfigError` it can
only see on its host, e.g. a checkpoint directory holding another run's steps): the
controller ends the run with that worker's reason instead of restarting it."""


class UnknownWorkerKind(ValueError):
    """A worker kind no module registered; the message is one line naming the known ones."""


@dataclass(frozen=True)
class WorkerKind:
    name: str
    entry: str
    """The worker class as "module:Class", imported lazily by `load_worker_class`."""
    per_policy: bool
    """Each policy has its own workers of this kind (else they serve every policy)."""
    count: Callable[[ExperimentConfig], int]
    """How many workers of this kind the config asks for (per policy where `per_policy`)."""
    host_role: str
    """Which hosts of a cluster script run it: one of HOST_ROLES."""
    doc: str
    saves_state: bool = False
    """Its state lives in its checkpoints: the controller restarts it only when checkpoints
    are on, and gives it `checkpoint.final_save_timeout_s` more to stop (a final save)."""
    process_group: bool = False
    """A policy's workers of this kind are one jax.distributed job: when one exits, the
    controller stops the others, and all of them restart together."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment its processes start with, where the launcher's own does not set it."""
    per_member: bool = False
    """In a population run, each member has its own workers of this kind, though the
    kind serves every policy otherwise (actors: a member is a whole pipeline)."""
    device_keys: str = ""
    """The config section whose keys put it on devices (`srl_jax/runtime/placement.py`):
    'learner' (`learner.devices`, a mesh), or a section with `device` and `device_memory`
    (one device: 'inference', 'evaluation'); '': it keeps its JAX, if any, on the CPU."""
    frozen_too: bool = False
    """A per-policy kind that frozen policies (`selfplay.frozen`, which act but do not
    train) have too: inference servers; learners and replay servers are only trained ones'."""
    progress: str = ""
    """The counter whose first rise is the run's first progress (actors: `env_frames`,
    learners: `learner_steps`): a worker of this kind heartbeats at once when it rises, so
    that the controller times the run's first env frame and update closely (status.json
    `startup`)."""
    counters: tuple[Counter, ...] = ()
    """Its heartbeat counters, declared once: what each is and the rows of metrics.jsonl
    it becomes (srl_jax/dataflow/metrics_table.py); those it sends undeclared add up as sums
    and make no row."""

    warm: bool = False
    """Forked from its host's warm parent (srl_jax/runtime/hosts/warm_parent.py), which has
    imported JAX and the kind's module: what imports JAX, or is cheap to fork."""

    variant: tuple[Callable[[ExperimentConfig], bool], str] | None = None
    """(when, "module:Class"): the class the kind runs instead of `entry` where `when(config)`
    holds (an actor with inline inference: a JAX-side subclass that runs the policy)."""
    variant_device_keys: str = ""
    """Where the variant runs: its `device_keys` (a reanalysing replay server searches on
    the inference servers' device: 'inference'); '': the kind's own."""

    def devices_section(self, config: ExperimentConfig) -> str:
        """The config section that places this kind's workers for `config` (`device_keys`,
        or `variant_device_keys` where the variant runs)."""
        if self.variant_device_keys and self.variant is not None and self.variant[0](config):
            return self.variant_device_keys
        return self.device_keys

    def __post_init__(self) -> None:
        for entry in [self.entry] + ([self.variant[1]] if self.variant else []):
            module, _, cls = entry.partition(":")
            if not module or not cls:
                raise ValueError(f"worker kind '{self.name}': entry '{entry}' is not "
                                 "'module:Class'")
        if self.host_role not in HOST_ROLES:
            raise ValueError(f"worker kind '{self.name}': host role '{self.host_role}' is not "
                             f"one of {', '.join(HOST_ROLES)}")

    def entry_for(self, config: ExperimentConfig) -> str:
        """The class its workers run for `config`: the variant's where it applies."""
        return self.variant[1] if self.variant is not None and self.variant[0](config) \
            else self.entry

    def start_env(self, launcher_env: Mapping[str, str]) -> dict[str, str]:
        """What the controller adds to the environment of a worker of this kind."""
        return {name: value for name, value in self.env.items() if name not in launcher_env}

    @property
    def ray_configured(self) -> bool:
        """Whether the config has a `ray.<name>` key for this kind's Ray resources."""
        return self.name in {field.name for field in fields(RayConfig)}

    def ray_resources(self, config: ExperimentConfig) -> dict[str, float]:
        """What one worker of this kind asks Ray for: `ray.<name>`, else one CPU."""
        return getattr(config.ray, self.name) if self.ray_configured else dict(DEFAULT_RESOURCES)


KINDS: dict[str, WorkerKind] = {}
"""Every worker kind by name, in the order the plan starts them."""


def register_kind(kind: WorkerKind) -> WorkerKind:
    """Add `kind` to the registry (a second registration of the same kind is a no-op)."""
    known = KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"worker kind '{kind.name}' is already registered ({known.entry})")
    KINDS[kind.name] = kind
    return kind


def worker_kind(name: str) -> WorkerKind:
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownWorkerKind(f"unknown worker kind '{name}' (known: "
                                f"{', '.join(KINDS)})") from None


def metrics_reference_markdown() -> str:
    """The metrics reference of the docs: every registered kind's counters and the rows of
    metrics.jsonl they become, as markdown tables."""
    return metrics_markdown({kind.name: kind.counters for kind in KINDS.values()})


def load_worker_class(name: str, config: ExperimentConfig) -> type:
    """Import the worker class of the kind `name` for `config`, in the process that runs it."""
    module, _, cls = worker_kind(name).entry_for(config).partition(":")
    return getattr(importlib.import_module(module), cls)


def worker_plan(config: ExperimentConfig) -> list[tuple[str, int, str]]:
    """Every worker of the run as (kind, index, policy): each policy its own workers of
    the per-policy kinds (learners, inference servers; in a population, each member its
    actors too; a frozen policy its inference servers alone), then the shared ones
    (actors, the evaluator, the population manager), each kind in registry order."""
    population = bool(config.population.members)
    per_policy = [kind for kind in KINDS.values()
                  if kind.per_policy or (population and kind.per_member)]
    shared = [kind for kind in KINDS.values() if kind not in per_policy]
    trained = run_policies(config)
    plan = [(kind.name, i, policy) for policy in acting_policies(config)
            for kind in per_policy if kind.frozen_too or policy in trained
            for i in range(kind.count(config))]
    plan += [(kind.name, i, DEFAULT_POLICY) for kind in shared for i in range(kind.count(config))]
    return plan


def _learners(config: ExperimentConfig) -> int:
    return config.learner.processes


def _inference_servers(config: ExperimentConfig) -> int:
    return 0 if config.actors.inline_inference else config.inference.count


def _replay_servers(config: ExperimentConfig) -> int:
    return config.replay.count


def _actors(config: ExperimentConfig) -> int:
    return config.actors.count


def _inline_inference(config: ExperimentConfig) -> bool:
    return config.actors.inline_inference


def _evaluators(config: ExperimentConfig) -> int:
    return 1 if config.evaluation.every_updates else 0


def _population_managers(config: ExperimentConfig) -> int:
    return 1 if config.population.members and config.population.exploit else 0


# Orbax runs each checkpoint save in new threads: with glibc's default of 8 malloc arenas
# per core, what they free spreads over all of them and stays resident
# (learners/training/checkpoint.py).
register_kind(WorkerKind(
    "learner", "learners.learner_worker:LearnerWorker", True, _learners, "learner",
    "trains its policy on sample chunks and publishes its parameters",
    saves_state=True, process_group=True, env={"MALLOC_ARENA_MAX": "2"},
    device_keys="learner", counters=LEARNER, warm=True, progress="learner_steps"))
register_kind(WorkerKind(
    "inference", "policy.inference_server:InferenceServer", True, _inference_servers,
    "inference", "answers the actors' batched policy requests", device_keys="inference",
    frozen_too=True, counters=INFERENCE, warm=True))
register_kind(WorkerKind(
    "replay", "replay.replay_worker:ReplayWorker", True, _replay_servers, "learner",
    "stores its policy's transitions and serves prioritized samples to the learner",
    counters=REPLAY, warm=True,
    variant=(reanalyses, "replay.reanalysing_replay:ReanalysingReplayWorker"),
    variant_device_keys="inference"))
register_kind(WorkerKind(
    "actor", "actors.actor_worker:ActorWorker", False, _actors, "actor",
    "steps environments for every policy (a population member's: for it alone), sends "
    "sample chunks to the learners", per_member=True, progress="env_frames",
    variant=(_inline_inference, "policy.inline_policy:InlineActorWorker"),
    counters=ACTOR))
register_kind(WorkerKind(
    "evaluator", "policy.evaluator:EvaluatorWorker", False, _evaluators, "actor",
    "plays evaluation episodes with the latest parameters", device_keys="evaluation",
    counters=EVALUATOR, warm=True))
register_kind(WorkerKind(
    "population", "srl_jax.runtime.population_manager:PopulationManager", False,
    _population_managers, "learner",
    "ranks the population's members and copies winners into losers (PBT)",
    counters=POPULATION))
