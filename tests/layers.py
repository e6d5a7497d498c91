"""The package's layer rules, stated by folder and checked by reading the source (ast,
nothing is imported).

Every module of `srl_jax`, `actors`, `learners` and `replay` lives in a folder, and every
folder belongs to one layer (docs/architecture.md draws them): a module may import the
layers its own layer names and no third-party package it forbids. A module in a folder no
layer names is refused, so a new file lands in a layer by where it is put, not by a list of
names. Imports inside functions count the same as those at the top: a lazy import still ties
the two modules together. Neither the modules nor the layers may import in a cycle.
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("srl_jax", "actors", "learners", "replay")
ENV_PACKAGES = frozenset({"gymnasium", "envpool", "ale_py", "mujoco", "pettingzoo", "mpe2",
                          "cv2", "pygame"})
JAX_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax", "orbax"})
NO_ENGINES = ENV_PACKAGES | JAX_PACKAGES | {"ray"}


@dataclass(frozen=True)
class Layer:
    name: str
    places: tuple[str, ...]
    """Folders (every module below them) or file patterns, relative to the repository."""
    may_import: frozenset[str]
    """Layers whose modules it may import (its own included)."""
    forbidden: frozenset[str] = frozenset()
    """Top-level third-party packages it must not import."""
    only_third_party: frozenset[str] | None = None
    """When set, the only third-party packages it may import (the standard library aside)."""


def _names(*layers: str) -> frozenset[str]:
    return frozenset(layers)


DECLARATIONS = ("learners/algorithms/*_config.py",)
LEARNING = ("core", "algorithm declarations", "models", "algorithms", "training")
LAYERS = (
    Layer("core", ("srl_jax/core", "srl_jax/config"), _names("core"), NO_ENGINES),
    Layer("actors", ("actors",), _names("core", "actors"), JAX_PACKAGES | {"ray"}),
    Layer("replay", ("replay",), _names("core", "actors", "replay"), NO_ENGINES),
    Layer("algorithm declarations", DECLARATIONS, _names("core", "algorithm declarations"),
          only_third_party=frozenset()),
    Layer("models", ("learners/models",), _names("core", "models"),
          ENV_PACKAGES | {"zmq", "ray"}),
    Layer("algorithms", ("learners/algorithms",), _names(*LEARNING[:4]),
          only_third_party=frozenset({"jax", "flax", "optax", "numpy", "mctx"})),
    Layer("training", ("learners/training",), _names(*LEARNING), ENV_PACKAGES | {"zmq", "ray"}),
    Layer("jax workers", ("learners/workers",),
          _names(*LEARNING, "actors", "replay", "jax workers"),
          frozenset({"ray"})),
    Layer("runtime", ("srl_jax/runtime",), _names("core", "runtime"), JAX_PACKAGES),
    Layer("analysis", ("srl_jax/analysis",), _names("core", "analysis"), NO_ENGINES - {"ray"}),
    Layer("entry points", ("srl_jax/*.py", "learners/__init__.py"),
          _names(*LEARNING, "actors", "replay", "jax workers", "runtime", "analysis",
                 "entry points")),
    # Above the launcher: the scripts' launch lines go through its own checks.
    Layer("cluster", ("srl_jax/cluster",), _names("core", "runtime", "entry points", "cluster"),
          JAX_PACKAGES),
)
"""Bottom to top; the first layer whose place holds a module is its layer."""


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the packages under `root`, by dotted name (package `__init__`s
    as the package name)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def layer_of(where: Path) -> Layer | None:
    """The first layer one of whose places holds the file at `where` (repository-relative):
    a folder holds every module below it, a pattern the files it matches."""
    posix = where.as_posix()
    for layer in LAYERS:
        for place in layer.places:
            if posix.startswith(place + "/") or fnmatch.fnmatchcase(posix, place):
                return layer
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every absolute import statement in the file, wherever it
    stands (in a function or under `if TYPE_CHECKING` too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _internal(imported: str, modules: dict[str, Path]) -> str | None:
    """The module of ours an import names (`from srl_jax.wire.codec import X`: srl_jax.wire.codec)."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in modules:
            return name
    return None


def violations(root: Path) -> list[str]:
    """One line per broken rule: `file:line: module imports X (why)`."""
    modules = module_files(root)
    problems, graph = [], {name: set() for name in modules}
    for name, path in modules.items():
        where = path.relative_to(root)
        layer = layer_of(where)
        if layer is None:
            problems.append(f"{where}: module {name} is in no layer's folder (move it into "
                            "one, or give its folder a layer in tests/layers.py)")
            continue
        for line, imported in imports(path):
            target = _internal(imported, modules)
            top = imported.split(".")[0]
            if target is not None:
                graph[name].add(target)
                target_layer = layer_of(modules[target].relative_to(root))
                if target_layer is not None and target_layer.name not in layer.may_import:
                    problems.append(f"{where}:{line}: {name} ({layer.name}) imports {imported} "
                                    f"({target_layer.name})")
            elif top in PACKAGES:
                problems.append(f"{where}:{line}: {name} imports {imported}, which does not exist")
            elif top in layer.forbidden:
                problems.append(f"{where}:{line}: {name} ({layer.name}) imports {imported}")
            elif layer.only_third_party is not None and not _stdlib(top) \
                    and top not in layer.only_third_party:
                problems.append(f"{where}:{line}: {name} ({layer.name}) imports {imported}; it "
                                f"may only use {sorted(layer.only_third_party)} and the "
                                "standard library")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    allowed = {layer.name: set(layer.may_import) - {layer.name} for layer in LAYERS}
    problems += [f"layer cycle: {' -> '.join(cycle)}" for cycle in cycles(allowed)]
    return problems


def _stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top == "__future__"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of two or more modules (or a
    module importing itself), found by depth-first search."""
    found, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        stack, on_path, path = [(start, iter(sorted(graph[start])))], {start}, [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(node)
                path.pop()
                done.add(node)
            elif child in on_path:
                cycle = [*path[path.index(child):], child]
                if not any(set(cycle) <= set(seen) for seen in found):
                    found.append(cycle)
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                on_path.add(child)
                path.append(child)
    return found
