"""The package's layer rules, checked by reading the source (ast, nothing is imported).

Every module of `srl_jax`, `actors`, `learners` and `replay` belongs to one layer; a layer
may import the layers it names and no third-party package it forbids. Imports
inside functions count the same as those at the top: a lazy import still ties
the two modules together. The module graph must also be free of cycles.
docs/architecture.md explains the layers; this file is what enforces them.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("srl_jax", "actors", "learners", "replay")
ENV_PACKAGES = frozenset({"gymnasium", "envpool", "ale_py", "mujoco", "pettingzoo", "mpe2",
                          "cv2", "pygame"})
JAX_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax", "orbax"})


@dataclass(frozen=True)
class Layer:
    name: str
    modules: frozenset[str]
    """Module names, or `package.*` for every module of a package not named elsewhere."""
    may_import: frozenset[str]
    """Layers whose modules it may import (its own included)."""
    forbidden: frozenset[str] = frozenset()
    """Top-level third-party packages it must not import."""
    only_third_party: frozenset[str] | None = None
    """When set, the only third-party packages it may import (the standard library aside)."""


def _names(*modules: str) -> frozenset[str]:
    return frozenset(modules)


LAYERS = (
    Layer("base", _names(
        "srl_jax.wire", "srl_jax.names", "srl_jax.name_server", "srl_jax.log_stream",
        "srl_jax.streams", "srl_jax.stream_table",
        "srl_jax.transport", "srl_jax.faults", "srl_jax.worker", "srl_jax.worker_kinds",
        "srl_jax.run_dir", "srl_jax.checkpoint_location", "srl_jax.incarnation",
        "srl_jax.metrics", "srl_jax.config",
        "srl_jax.config_loader", "srl_jax.config_checks", "srl_jax.chunk_spec",
        "srl_jax.env_spec", "srl_jax.replay_spec", "srl_jax.memory", "srl_jax.placement",
        "srl_jax.population", "srl_jax.opponent_pool"),
        may_import=_names("base"), forbidden=ENV_PACKAGES | JAX_PACKAGES | {"ray"}),
    Layer("actors", _names("actors.*"), may_import=_names("base", "actors"),
          forbidden=JAX_PACKAGES | {"ray"}),
    Layer("replay", _names("replay.*"), may_import=_names("base", "actors", "replay"),
          forbidden=ENV_PACKAGES | JAX_PACKAGES | {"ray"}),
    Layer("algorithm configs", _names(
        "learners.ppo_config", "learners.impala_config", "learners.dqn_config"),
        may_import=_names("base", "learning"), only_third_party=frozenset()),
    Layer("algorithms", _names("learners.ppo", "learners.impala", "learners.dqn"),
          may_import=_names("base", "learning", "algorithm configs", "algorithms"),
          only_third_party=frozenset({"jax", "flax", "optax", "numpy"})),
    Layer("learning", _names(
        "learners.algorithms", "learners.networks", "learners.distributions",
        "learners.train_state", "learners.sequences", "learners.critic", "learners.mesh",
        "learners.param_codec",
        "learners.sample_queue", "learners.conv",
        "learners.learner", "learners.policy_runner", "learners.policy", "learners.distributed",
        "learners.jax_runtime", "srl_jax.checkpoint"),
        may_import=_names("base", "learning"), forbidden=ENV_PACKAGES | {"zmq", "ray"}),
    Layer("jax workers", _names("learners.*", "actors.inline_policy"),
          may_import=_names("base", "actors", "learning", "algorithm configs", "algorithms",
                            "jax workers"),
          forbidden=frozenset({"ray"})),
    Layer("top", _names("srl_jax.*"),
          may_import=_names("base", "actors", "replay", "learning", "algorithm configs",
                            "algorithms", "jax workers", "top")),
)


LAZY_ONLY = {
    ("actors.actor_worker", "actors.inline_policy"):
        "inline inference: an actor imports JAX only when it runs the policy itself",
}
"""Edges across layers that are allowed only as lazy imports (in a function, or for type
checking), with the reason."""


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the packages under `root`, by dotted name (package `__init__`s
    as the package name)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            files[name] = path
    return files


def layer_of(module: str) -> Layer | None:
    """The layer naming `module` itself, else the first whose `package.*` covers it."""
    for layer in LAYERS:
        if module in layer.modules:
            return layer
    package = module.split(".")[0]
    return next((layer for layer in LAYERS if f"{package}.*" in layer.modules), None)


def imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, eager) for every import statement in the file; eager ones run
    when the module is imported (not inside a function, nor under `if TYPE_CHECKING`)."""
    tree = ast.parse(path.read_text(), str(path))
    eager = set()

    def top_level(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import | ast.ImportFrom):
                eager.add(id(node))
            elif isinstance(node, ast.If) and not _is_type_checking(node.test):
                top_level(node.body)
                top_level(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody,
                              *(handler.body for handler in node.handlers)):
                    top_level(block)

    top_level(tree.body)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in eager) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, id(node) in eager))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _internal(imported: str, modules: dict[str, Path]) -> str | None:
    """The module of ours an import names (`from srl_jax.config import X` -> srl_jax.config)."""
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
        layer = layer_of(name)
        where = path.relative_to(root)
        if layer is None:
            problems.append(f"{where}: module {name} belongs to no layer (add it to "
                            "tests/layers.py and docs/architecture.md)")
            continue
        for line, imported, eager in imports(path):
            target = _internal(imported, modules)
            top = imported.split(".")[0]
            if target is not None:
                graph[name].add(target)
                target_layer = layer_of(target)
                lazy_allowed = (name, target) in LAZY_ONLY and not eager
                if target_layer is not None and target_layer.name not in layer.may_import \
                        and not lazy_allowed:
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
