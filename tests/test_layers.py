"""The import rules of tests/layers.py hold for the package and catch a bad import, a JAX import
in a module that must stay free of JAX, and a module planted in the wrong folder."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from tests.layers import FOLDERS, PACKAGES, cycles, violations

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_keeps_its_import_rules_and_has_no_import_cycles() -> None:
    assert violations(ROOT) == []


def test_the_declared_folders_import_each_other_without_a_cycle() -> None:
    places = {folder.place for folder in FOLDERS}
    assert all(set(folder.may_import) <= places for folder in FOLDERS)
    assert cycles({folder.place: set(folder.may_import) for folder in FOLDERS}) == []


def _copy_packages(destination: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, destination / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def test_a_jax_import_planted_in_a_jax_free_module_fails_naming_the_file(tmp_path: Path) -> None:
    """The wire is free of JAX by the rule per module, even for an import inside a function."""
    root = _copy_packages(tmp_path)
    codec = root / "srl_jax" / "wire" / "codec.py"
    lines = codec.read_text().splitlines()
    codec.write_text("\n".join([*lines, "", "def _late() -> None:", "    import jax", ""]))
    assert violations(root) == [
        f"srl_jax/wire/codec.py:{len(lines) + 3}: srl_jax.wire.codec imports jax, but it must "
        "stay free of JAX (JAX_FREE)"]


def test_a_module_the_actor_loads_may_not_import_jax_wherever_it_sits(tmp_path: Path) -> None:
    """An actor-side module is free of JAX because the actor worker loads it, not because of
    its folder: the same import in an evaluator-only module is allowed."""
    root = _copy_packages(tmp_path)
    ring = root / "actors" / "env_ring.py"
    ring.write_text(ring.read_text() + "\nimport jax\n")
    evaluator = root / "policy" / "evaluator.py"
    evaluator.write_text(evaluator.read_text() + "\nimport optax\n")
    problems = violations(root)
    assert len(problems) == 1
    assert problems[0].startswith("actors/env_ring.py:")
    assert problems[0].endswith("imports jax, but it must stay free of JAX (JAX_FREE, which "
                                "actors.actor_worker loads)")


def test_actors_import_jax_only_for_jax_native_envs(tmp_path: Path) -> None:
    """An env family that an actor imports by name is free of JAX all the same; the JaxMARL
    family alone imports it (and nothing JAX-free loads that one as it loads)."""
    root = _copy_packages(tmp_path)
    family = root / "actors" / "env_families" / "gymnasium_envs.py"
    lines = family.read_text().splitlines()
    family.write_text("\n".join([*lines, "", "def _late() -> None:", "    import jax", ""]))
    assert "import jax\n" in (root / "actors" / "env_families" / "jax_envs.py").read_text()
    assert [p for p in violations(root) if "JAX" in p] == [
        f"actors/env_families/gymnasium_envs.py:{len(lines) + 3}: "
        "actors.env_families.gymnasium_envs imports jax, but it must stay free of JAX (JAX_FREE)"]


def test_an_actor_module_importing_a_learner_module_is_refused(tmp_path: Path) -> None:
    root = _copy_packages(tmp_path)
    ring = root / "actors" / "env_ring.py"
    ring.write_text(ring.read_text() + "\nfrom learners.models.networks import make_policy\n")
    problems = violations(root)
    assert problems and problems[0].startswith("actors/env_ring.py:")
    assert "actors.env_ring (actors) imports learners.models.networks (learners/models)" \
        in problems[0]
    assert all("JAX" in p for p in problems[1:])


def test_a_module_planted_in_the_wrong_folder_fails(tmp_path: Path) -> None:
    """The folder decides what a module may import: PPO's math copied into the wire breaks
    the wire's rules, and a new folder no entry names holds no module."""
    root = _copy_packages(tmp_path)
    shutil.copy(root / "learners" / "algorithms" / "ppo.py", root / "srl_jax" / "wire" / "ppo.py")
    (root / "learners" / "a2c").mkdir()
    (root / "learners" / "a2c" / "loss.py").write_text("import jax\n")
    problems = violations(root)
    planted = [p for p in problems if p.startswith("srl_jax/wire/ppo.py:")]
    assert planted and all("srl_jax.wire.ppo" in p for p in planted)
    assert any("(srl_jax/wire) imports learners.models" in p for p in planted)
    unplaced = "learners/a2c/loss.py: module learners.a2c.loss is in no folder"
    assert [p for p in problems if p.startswith(unplaced)]
    # The wire is free of JAX, so what the planted module loads must be too; and the wire,
    # at the bottom, now imports the folders above it.
    assert all("srl_jax.wire.ppo" in p or p.startswith(unplaced) or
               (p.startswith("folder cycle:") and "srl_jax/wire -> learners/" in p)
               for p in problems)


def test_cycles_are_found_through_lazy_imports_too() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["d", "d"]]


def test_bench_is_a_package_that_edits_no_import_path() -> None:
    edits = [f"{path.relative_to(ROOT)}:{node.lineno}"
             for path in sorted((ROOT / "bench").rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert (ROOT / "bench" / "__init__.py").exists()
    assert edits == []


def test_the_learner_worker_switches_on_no_intake_type() -> None:
    """Sample and replay intakes answer one protocol (learners/intake/intake.py)."""
    switches = [f"{path.relative_to(ROOT)}:{node.lineno}"
                for path in sorted((ROOT / "learners").rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"
                and "Intake" in ast.unparse(node.args[1])]
    assert switches == []
