"""The layer rules of tests/layers.py hold for the package and catch a bad import or a module
planted in the wrong folder; the tree keeps the sizes that let a reader hold each part in mind."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from tests.layers import LAYERS, PACKAGES, cycles, violations

ROOT = Path(__file__).resolve().parent.parent
SOURCE_TREES = (*PACKAGES, "bench")
MAX_MODULES_PER_FOLDER = 15
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250


def test_the_package_keeps_its_layers_and_has_no_import_cycles() -> None:
    assert violations(ROOT) == []


def test_the_declared_layers_import_each_other_without_a_cycle() -> None:
    allowed = {layer.name: set(layer.may_import) - {layer.name} for layer in LAYERS}
    assert cycles(allowed) == []


def _copy_packages(destination: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, destination / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def test_a_planted_bad_import_fails_naming_the_file_and_the_import(tmp_path: Path) -> None:
    root = _copy_packages(tmp_path)
    wire = root / "srl_jax" / "core" / "wire.py"
    lines = wire.read_text().splitlines()
    wire.write_text("\n".join([*lines, "", "def _late() -> None:", "    import jax", ""]))
    bad_line = len(lines) + 3
    assert violations(root) == [
        f"srl_jax/wire/codec.py:{bad_line}: srl_jax.wire.codec (core) imports jax"]


def test_an_actor_module_importing_a_learner_module_is_refused(tmp_path: Path) -> None:
    root = _copy_packages(tmp_path)
    ring = root / "actors" / "env_ring.py"
    ring.write_text(ring.read_text() + "\nfrom learners.models.networks import make_policy\n")
    problems = violations(root)
    assert len(problems) == 1
    assert problems[0].startswith("actors/env_ring.py:")
    assert "actors.env_ring (actors) imports learners.models.networks (models)" in problems[0]


def test_a_module_planted_in_the_wrong_folder_fails(tmp_path: Path) -> None:
    """The folder decides the layer: PPO's math copied into the core breaks the core's rules,
    and a new algorithm dropped loose into learners/ belongs to no layer at all."""
    root = _copy_packages(tmp_path)
    shutil.copy(root / "learners" / "algorithms" / "ppo.py", root / "srl_jax" / "core" / "ppo.py")
    (root / "learners" / "a2c.py").write_text("import jax\n")
    problems = violations(root)
    planted = [p for p in problems if p.startswith("srl_jax/core/ppo.py:")]
    assert planted and all("srl_jax.core.ppo (core) imports" in p for p in planted)
    assert any(p.endswith("imports jax") for p in planted)
    assert any("(models)" in p for p in planted)
    assert "learners/a2c.py: module learners.a2c is in no layer's folder" in "\n".join(problems)
    assert len(problems) == len(planted) + 1


def test_cycles_are_found_through_lazy_imports_too() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["d", "d"]]


def _source_files() -> list[Path]:
    return [path for tree in SOURCE_TREES for path in sorted((ROOT / tree).rglob("*.py"))]


def test_folders_modules_and_classes_stay_small() -> None:
    """The issue's limits: at most 15 modules a folder, 450 lines a module, 250 a class."""
    too_big = []
    folders = {path.parent for path in _source_files()}
    for folder in sorted(folders):
        count = len(list(folder.glob("*.py")))
        if count > MAX_MODULES_PER_FOLDER:
            too_big.append(f"{folder.relative_to(ROOT)}/: {count} modules")
    for path in _source_files():
        text = path.read_text()
        where = path.relative_to(ROOT)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and \
                    node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_big.append(f"{where}: class {node.name}, "
                               f"{node.end_lineno - node.lineno + 1} lines")
    assert too_big == []


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
