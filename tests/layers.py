"""The tree's import rules, stated by folder and by module and checked by reading the source
(ast, nothing is imported).

Folders are named after the system's parts (docs/architecture.md draws the tree). A module
belongs to the concept folder it sits in, and may import its own folder, the folders below
it that its folder names, and no third-party package its folder forbids; a module in a
folder no entry names is refused, so a new file lands by where it is put. Which modules may
import JAX is a rule per module: whatever the processes that must start fast load as they
start (`JAX_FREE`) imports no JAX package, wherever it sits; of the actor side, only the
family of JAX-native envs does (`JAX_NATIVE`). Imports inside functions count
the same as those at the top for the folders and for cycles: a lazy import still ties two
modules together. Neither modules nor folders may import in a cycle.
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("srl_jax", "actors", "policy", "learners", "replay")
ENV_PACKAGES = frozenset({"gymnasium", "envpool", "ale_py", "mujoco", "pettingzoo", "mpe2",
                          "cv2", "pygame"})
JAX_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax", "orbax", "mctx"})
LEARNING_ONLY = ENV_PACKAGES | {"zmq", "ray"}
"""What the learner side's math and models never touch: envs and sockets."""


@dataclass(frozen=True)
class Folder:
    place: str
    """A folder of the repository; its subfolders belong to it unless `flat`."""
    holds: str
    """What it is, in one line (the docs' tree shows it)."""
    may_import: tuple[str, ...] = ()
    """The folders below it whose modules it may import (its own always)."""
    forbidden: frozenset[str] = frozenset()
    """Top-level third-party packages it must not import."""
    only_third_party: frozenset[str] | None = None
    """When set, the only third-party packages it may import (the standard library aside)."""
    flat: bool = False
    """Only the modules directly in it: its subfolders are folders of their own."""


W, C, D, R = "srl_jax/wire", "srl_jax/config", "srl_jax/dataflow", "srl_jax/runtime"
M, A, T = "learners/models", "learners/algorithms", "learners/training"
FOLDERS = (
    Folder(W, "the wire format, streams, transports, shared-memory channels, names",
           forbidden=ENV_PACKAGES | {"ray"}),
    Folder(C, "the experiment's schema, loader and checks; env families and populations",
           (W,), ENV_PACKAGES | {"ray", "zmq"}),
    Folder(D, "what a config's run is made of: worker kinds, streams, algorithms' "
           "declarations, data layouts, metrics, the plan", (C, W), ENV_PACKAGES | {"ray"}),
    Folder(R, "the run: controller, supervisor, worker shell, names, backends, host agents, "
           "warm parents, placement, status", (D, C, W), ENV_PACKAGES),
    Folder("actors", "the actor side: actor core and shell, env ring, env families",
           (R, D, C, W), frozenset({"ray"})),
    Folder(M, "networks, torsos, distributions", (D, C), LEARNING_ONLY),
    Folder(A, "PPO, IMPALA, Ape-X DQN, R2D2, MuZero, QMIX: pure functions, each beside its "
           "declaration", (M, D, C),
           only_third_party=frozenset({"jax", "flax", "optax", "numpy", "mctx"})),
    Folder(T, "the socket-free learner, mesh, jax.distributed, checkpoints", (A, M, R, D, C, W),
           LEARNING_ONLY),
    Folder("policy", "the policy side: inference server, evaluator, inline policy, "
           "load_policy", ("actors", T, A, M, R, D, C, W), frozenset({"ray"})),
    Folder("replay", "replay servers: storage, priorities, rate limits, reanalysis",
           ("policy", "actors", T, R, D, C, W), ENV_PACKAGES | {"ray"}),
    Folder("learners/intake", "where a learner's batches come from: samples or replay",
           ("actors", T, R, D, C, W), ENV_PACKAGES | {"ray"}),
    Folder("learners", "the learner worker and what it publishes", (
        "learners/intake", "policy", "actors", T, A, M, R, D, C, W), ENV_PACKAGES | {"ray"},
           flat=True),
    Folder("srl_jax/analysis", "notebooks' API: load runs, compare, plot", (R, C),
           ENV_PACKAGES | JAX_PACKAGES),
    Folder("srl_jax", "entry points: launch, worker, evaluate; the public API",
           ("policy", "actors", R, D, C, W), flat=True),
    Folder("srl_jax/cluster", "Slurm and TPU VM scripts, Ray nodes: their launch lines go "
           "through the launcher's checks", ("srl_jax", R, D, C, W)),
)
"""Bottom to top."""

JAX_FREE = ("srl_jax", "srl_jax.launch", "srl_jax.worker", "srl_jax.wire.*", "srl_jax.config.*",
            "srl_jax.dataflow.*", "srl_jax.runtime.*", "srl_jax.cluster.*", "srl_jax.analysis.*",
            "actors.actor_worker", "actors.env_families.*", "replay.replay_worker",
            "learners.algorithms.*_config")
"""Modules (dotted, fnmatch patterns) that import no JAX package, nor does anything they import
as they load: the launcher and controller, host agents, actors and replay servers start fast
and fork nothing heavy, and the launcher checks a whole config, the algorithm's section
included, without JAX. A worker kind whose class imports JAX is named by string
(srl_jax/dataflow/worker_kinds.py) and imported only in its own process."""
JAX_NATIVE = ("actors.env_families.jax_envs",)
"""The exception among them: actors import JAX only for JAX-native envs, whose family steps a
split as one jitted call (JaxMARL). Every env family is named by string in the family table
(srl_jax/config/env_families.py) and imported by an actor of its envs alone; nothing JAX-free
may load this one as it loads."""

def module_files(root: Path) -> dict[str, Path]:
    """Every module of the packages under `root`, by dotted name (package `__init__`s
    as the package name)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def folder_of(where: Path) -> Folder | None:
    """The folder entry that holds the file at `where` (repository-relative): the deepest
    whose place holds it, directly where the entry is flat."""
    parent, best = where.parent.as_posix(), None
    for folder in FOLDERS:
        holds = parent == folder.place or (not folder.flat and
                                          parent.startswith(folder.place + "/"))
        if holds and (best is None or len(folder.place) > len(best.place)):
            best = folder
    return best


@dataclass(frozen=True)
class Import:
    line: int
    module: str
    at_load: bool
    """Run as the module loads (not inside a function, not under `if TYPE_CHECKING`)."""


def imports(path: Path) -> list[Import]:
    """Every absolute import statement in the file, wherever it stands."""
    found: list[Import] = []

    def visit(node: ast.AST, at_load: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = at_load and not isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                found.extend(Import(child.lineno, alias.name, at_load) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append(Import(child.lineno, child.module, at_load))
            visit(child, inside)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def _internal(imported: str, modules: dict[str, Path]) -> str | None:
    """The module of ours an import names (`from srl_jax.wire.codec import X`: its module)."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in modules:
            return name
    return None


def jax_free(modules: dict[str, Path]) -> dict[str, str]:
    """Every module that must import no JAX -> the `JAX_FREE` module that loads it (itself,
    where it is one; else the first, in name order, that reaches it)."""
    roots = sorted(name for name in modules
                   if any(fnmatch.fnmatchcase(name, pattern) for pattern in JAX_FREE)
                   and name not in JAX_NATIVE)
    found = {root: root for root in roots}
    for root in roots:  # each reaches what it loads before the next root looks
        queue = [root]
        for name in queue:
            for entry in imports(modules[name]):
                target = _internal(entry.module, modules)
                if entry.at_load and target is not None and target not in found:
                    found[target] = root
                    queue.append(target)
    return found


def violations(root: Path) -> list[str]:
    """One line per broken rule: `file:line: module imports X (why)`."""
    modules = module_files(root)
    free = jax_free(modules)
    problems: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in modules}
    folders: dict[str, set[str]] = {folder.place: set() for folder in FOLDERS}
    for name, path in modules.items():
        where = path.relative_to(root)
        folder = folder_of(where)
        if folder is None:
            problems.append(f"{where}: module {name} is in no folder tests/layers.py names "
                            "(move it into one, or name its folder in FOLDERS)")
            continue
        for entry in imports(path):
            imported, target, top = entry.module, _internal(entry.module, modules), \
                entry.module.split(".")[0]
            at = f"{where}:{entry.line}: {name}"
            if top in JAX_PACKAGES and name in free:
                why = "" if free[name] == name else f", which {free[name]} loads"
                problems.append(f"{at} imports {imported}, but it must stay free of JAX "
                                f"(JAX_FREE{why})")
            if target is not None:
                graph[name].add(target)
                other = folder_of(modules[target].relative_to(root))
                if other is None or other is folder:
                    continue
                folders[folder.place].add(other.place)
                if other.place not in folder.may_import:
                    problems.append(f"{at} ({folder.place}) imports {imported} ({other.place})")
            elif top in PACKAGES:
                problems.append(f"{at} imports {imported}, which does not exist")
            elif top in folder.forbidden:
                problems.append(f"{at} ({folder.place}) imports {imported}")
            elif folder.only_third_party is not None and not _stdlib(top) \
                    and top not in folder.only_third_party:
                problems.append(f"{at} ({folder.place}) imports {imported}; it may only use "
                                f"{sorted(folder.only_third_party)} and the standard library")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    problems += [f"folder cycle: {' -> '.join(cycle)}" for cycle in cycles(folders)]
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
