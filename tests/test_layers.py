"""The layer rules of tests/layers.py hold for the package, and catch a bad import."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.layers import PACKAGES, cycles, violations

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_keeps_its_layers_and_has_no_import_cycles() -> None:
    assert violations(ROOT) == []


def _copy_packages(destination: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, destination / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def test_a_planted_bad_import_fails_naming_the_file_and_the_import(tmp_path: Path) -> None:
    root = _copy_packages(tmp_path)
    wire = root / "srl_jax" / "wire.py"
    lines = wire.read_text().splitlines()
    wire.write_text("\n".join([*lines, "", "def _late() -> None:", "    import jax", ""]))
    bad_line = len(lines) + 3
    assert violations(root) == [f"srl_jax/core/wire.py:{bad_line}: srl_jax.core.wire (base) imports jax"]


def test_an_actor_module_importing_a_learner_module_is_refused(tmp_path: Path) -> None:
    root = _copy_packages(tmp_path)
    ring = root / "actors" / "env_ring.py"
    ring.write_text(ring.read_text() + "\nfrom learners.models.networks import make_policy\n")
    problems = violations(root)
    assert len(problems) == 1
    assert problems[0].startswith("actors/env_ring.py:")
    assert "actors.env_ring (actors) imports learners.models.networks (learning)" in problems[0]


def test_a_module_outside_every_layer_is_named(tmp_path: Path) -> None:
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors" / "__init__.py").write_text("")
    (tmp_path / "learners").mkdir()
    (tmp_path / "learners" / "__init__.py").write_text("")
    (tmp_path / "srl_jax").mkdir()
    (tmp_path / "srl_jax" / "__init__.py").write_text("")
    assert violations(tmp_path) == []
    (tmp_path / "learners" / "replay.py").write_text("import numpy\n")
    assert violations(tmp_path) == []  # learners.* is the jax-workers layer
    (tmp_path / "srl_jax" / "wire.py").write_text("import srl_jax.launch\n")
    (tmp_path / "srl_jax" / "launch.py").write_text("")
    assert violations(tmp_path) == [
        "srl_jax/core/wire.py:1: srl_jax.core.wire (base) imports srl_jax.launch (top)"]


def test_cycles_are_found_through_lazy_imports_too() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["d", "d"]]
