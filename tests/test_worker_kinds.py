"""The worker-kind registry: the run's worker plan, worker classes and new kinds."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from srl_jax.cluster.roles import placement_overrides, worker_asks
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.worker_kinds import (
    KINDS,
    UnknownWorkerKind,
    WorkerKind,
    load_worker_class,
    register_kind,
    worker_kind,
    worker_plan,
)
from srl_jax.runtime.worker_base import Worker
from tests.conftest import REPO, make_config, write_run_dir

TWO_POLICIES = "env.policies={first: [agent_0], others: ['agent_*']}"


class ArchiveWorker(Worker):
    """A stand-in for a future kind: one per policy, as many as the config's learners."""

    kind = "archive"


def _one_per_learner(config: ExperimentConfig) -> int:
    return config.learner.processes


ARCHIVE = WorkerKind("archive", f"{__name__}:ArchiveWorker", True, _one_per_learner, "learner",
                    "holds its policy's archive of episodes")


@pytest.fixture
def archive_registered() -> Iterator[WorkerKind]:
    register_kind(ARCHIVE)
    yield ARCHIVE
    del KINDS["archive"]


def test_a_single_policy_plan_has_learners_servers_and_actors() -> None:
    config = make_config(["actors.count=3", "inference.count=2", "evaluation.every_updates=0"])
    assert worker_plan(config) == [
        ("learner", 0, "default"), ("inference", 0, "default"), ("inference", 1, "default"),
        ("actor", 0, "default"), ("actor", 1, "default"), ("actor", 2, "default")]


def test_each_policy_has_its_own_learners_and_servers_and_the_actors_are_shared() -> None:
    config = make_config(["env.id=pettingzoo:mpe2.simple_spread_v3", TWO_POLICIES,
                          "actors.count=2", "inference.count=1", "learner.processes=2",
                          "evaluation.every_updates=0"])
    assert worker_plan(config) == [
        ("learner", 0, "first"), ("learner", 1, "first"), ("inference", 0, "first"),
        ("learner", 0, "others"), ("learner", 1, "others"), ("inference", 0, "others"),
        ("actor", 0, "default"), ("actor", 1, "default")]


def test_inline_inference_plans_no_servers() -> None:
    config = make_config(["actors.inline_inference=true", "inference.count=4"])
    assert "inference" not in Counter(kind for kind, _, _ in worker_plan(config))


@pytest.mark.parametrize("every, evaluators", [(0, 0), (5, 1)])
def test_the_evaluator_is_planned_when_evaluation_is_on(every: int, evaluators: int) -> None:
    plan = worker_plan(make_config([f"evaluation.every_updates={every}"]))
    assert [w for w in plan if w[0] == "evaluator"] == [("evaluator", 0, "default")][:evaluators]


def test_learner_processes_are_indexed_per_policy() -> None:
    plan = worker_plan(make_config(["learner.processes=4"]))
    assert [index for kind, index, _ in plan if kind == "learner"] == [0, 1, 2, 3]


def test_every_built_in_kind_names_an_importable_module() -> None:
    """Checked without importing them: the actor's module must not pull in JAX here."""
    for kind in KINDS.values():
        module = kind.entry.partition(":")[0]
        assert (REPO / Path(*module.split("."))).with_suffix(".py").is_file(), kind.entry


def test_learners_start_with_two_malloc_arenas_unless_the_launcher_says_otherwise() -> None:
    """What each checkpoint save's threads free stays reusable (learners/training/checkpoint.py)."""
    assert worker_kind("learner").start_env({"PATH": "/bin"}) == {"MALLOC_ARENA_MAX": "2"}
    assert worker_kind("learner").start_env({"MALLOC_ARENA_MAX": "8"}) == {}
    assert worker_kind("actor").start_env({}) == {}


def test_a_registered_kind_joins_the_plan_and_its_class_loads(
        archive_registered: WorkerKind) -> None:
    plan = worker_plan(make_config(["learner.processes=2", "evaluation.every_updates=0"]))
    assert [w for w in plan if w[0] == "archive"] == [("archive", 0, "default"),
                                                    ("archive", 1, "default")]
    assert plan.index(("archive", 0, "default")) < plan.index(("actor", 0, "default")), \
        "per-policy kinds come first"
    assert load_worker_class("archive", make_config()) is ArchiveWorker
    assert register_kind(ARCHIVE) is ARCHIVE, "registering the same kind again is a no-op"
    assert archive_registered.ray_resources(make_config()) == {"CPU": 1.0}, "no ray.archive key"
    assert not any(o.startswith("ray.archive=")
               for o in placement_overrides(worker_asks()))


def test_a_second_kind_under_a_known_name_is_refused() -> None:
    other = WorkerKind("actor", "elsewhere:Actor", False, _one_per_learner, "actor", "")
    with pytest.raises(ValueError, match="'actor' is already registered"):
        register_kind(other)


def test_a_kind_declared_wrong_is_refused() -> None:
    with pytest.raises(ValueError, match="is not 'module:Class'"):
        WorkerKind("archive", "tests.test_worker_kinds", True, _one_per_learner, "learner", "")
    with pytest.raises(ValueError, match="host role 'gpu'"):
        WorkerKind("archive", "a:B", True, _one_per_learner, "gpu", "")


def test_an_unknown_kind_fails_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(UnknownWorkerKind) as error:
        worker_kind("archive")
    assert str(error.value) == ("unknown worker kind 'archive' (known: learner, "
                                "inference, replay, actor, evaluator, population)")
    write_run_dir(tmp_path, make_config())
    result = subprocess.run([sys.executable, "-m", "srl_jax.worker", "archive", "0",
                             "--run-dir", str(tmp_path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith(str(error.value))
