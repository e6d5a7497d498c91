"""MkDocs hook (mkdocs.yml `hooks:`): the reference pages, generated from the code's own
tables at every build, so that they cannot drift from it; none of them is committed.

    reference/config.md    every config key: its type, default and the docstring under it
                           (srl_jax/config/schema.py, each algorithm's `learner.<name>`)
    reference/dataflow.md  the streams, the chunk's fields, the worker kinds, the plans of
                           shipped experiments (srl_jax/dataflow/plan.py, as `--plan`
                           prints them) and the layers (tests/layers.py)
    reference/metrics.md   the keys of metrics.jsonl (srl_jax/dataflow/metrics_table.py)
    reference/registries.md  the algorithms and the env families, as registered

and the home page, `index.md`: the repository's README.md, its links into `docs/` made
relative to the site, so that the front page is written once.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import itertools
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
import zmq
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from srl_jax.config.env_families import families
from srl_jax.config.loader import load_config
from srl_jax.config.schema import SECTIONS, ExperimentConfig
from srl_jax.dataflow.algorithms import BUILT_IN, algorithm
from srl_jax.dataflow.chunk_spec import AS_SENT, CHUNK_FIELDS
from srl_jax.dataflow.plan import Carriers, make_plan
from srl_jax.dataflow.stream_table import KEY_PREFIX, STREAMS
from srl_jax.dataflow.worker_kinds import KINDS, metrics_reference_markdown

GENERATED = "*Generated from the code at every build of this site by `docs/hooks.py`.*"
REPOSITORY = Path(__file__).resolve().parent.parent
LAYER_RULES = REPOSITORY / "tests" / "layers.py"
"""The layer test's rules: a file of the test suite, not of an installed package."""


def cell(text: str) -> str:
    """`text` on one line, safe in a table cell: pipes escaped, and angle brackets outside
    code spans too (`runs/<name>/` is a path, not an HTML tag)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
                    for i, part in enumerate(parts))


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A markdown table of one-line cells."""
    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(map(cell, cells)) + " |"

    return [line(header), line(tuple("---" for _ in header)), *map(line, rows)]


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, by field name (the source's string
    literal right after the field's annotated assignment)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def yaml_value(value: Any) -> str:
    """A default as it would be written in a config file."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return f"`{value}`" if value else "`''`"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip()}`" if isinstance(
        value, dict | list) else f"`{value}`"


def _sections(cls: type, prefix: str) -> Iterator[tuple[str, str, type]]:
    """(dotted key, doc, dataclass) of `cls`'s sections, depth first, `cls` first."""
    yield prefix, "", cls
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            for key, doc, section in _sections(hints[f.name], f"{prefix}.{f.name}".lstrip(".")):
                yield key, doc or docs.get(f.name, ""), section


def section_table(prefix: str, cls: type) -> list[str]:
    """One row per key of a config section that is not a section itself."""
    hints, docs, defaults = typing.get_type_hints(cls), field_docs(cls), cls()
    rows = [(f"`{prefix}{f.name}`", str(f.type), yaml_value(getattr(defaults, f.name)),
             docs.get(f.name, "-"))
            for f in dataclasses.fields(cls)
            if not dataclasses.is_dataclass(hints[f.name]) and not f.metadata.get(SECTIONS)]
    return table(("key", "type", "default", "meaning"), rows)


def config_page() -> str:
    lines = ["# Config keys", "", GENERATED, "",
             "Every key of an experiment config, with its type, its default and the "
             "docstring under its field. Set a key in the YAML file, or on the command line "
             "with `--set section.key=value` (the value is YAML). See "
             "[Configuration](../configuration.md) for how a config is read and checked.", ""]
    for key, doc, cls in _sections(ExperimentConfig, ""):
        title = f"`{key}`" if key else "Top level"
        lines += [f"## {title}", "", *([cell(doc), ""] if doc else []),
                  *section_table(f"{key}." if key else "", cls), ""]
    for name in BUILT_IN:
        config = algorithm(name).config
        lines += [f"## `learner.{name}`", "", cell(inspect.getdoc(config)), "",
                  *section_table(f"learner.{name}.", config), ""]
    return "\n".join(lines)


def _socket(kind: str, socket_type: int | None) -> str:
    return kind if socket_type is None else f"{kind} ({zmq.SocketType(socket_type).name})"


def layer_rows() -> list[tuple[str, ...]]:
    """One row per folder of `tests/layers.py`, bottom to top."""
    spec = importlib.util.spec_from_file_location("layer_rules", LAYER_RULES)
    rules = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # for its dataclasses
    spec.loader.exec_module(rules)

    def names(packages: frozenset[str] | tuple[str, ...]) -> str:
        return ", ".join(sorted(packages)) or "-"

    return [(f"`{folder.place}/`" + (" (its modules only)" if folder.flat else ""), folder.holds,
             names(tuple(f"`{place}`" for place in folder.may_import)),
             names(folder.forbidden) if folder.only_third_party is None
             else f"any but {names(folder.only_third_party)}")
            for folder in rules.FOLDERS]


PLANNED = ("cartpole_ppo", "cartpole_dqn", "rps_selfplay")
"""Shipped experiments whose plans the dataflow page draws: on-policy, replay, self-play."""


def plan_sections() -> list[str]:
    """Each of `PLANNED`'s plans, drawn and as `--plan` prints it (local backend, shared
    memory on)."""
    lines = []
    for name in PLANNED:
        plan = make_plan(load_config(REPOSITORY / "configs" / f"{name}.yaml"),
                         Carriers(shared_memory=True))
        lines += [f"### {name}", "", "```mermaid", plan.mermaid(), "```", "", "```text",
                  *plan.lines(), "```", ""]
    return lines


def dataflow_page() -> str:
    streams = [(f"`{s.name}`", _socket(s.binder, s.bind_type),
                ", ".join(_socket(c, s.connect_type) for c in s.connecters),
                ", ".join(f"`{k}`" for k in sorted(s.kinds)) or "-",
                f"`{'<policy>/' if s.per_policy else ''}{KEY_PREFIX}{s.name}"
                f"{'.<index>' if s.indexed else ''}`", s.doc)
               for s in STREAMS]
    fields = [(f"`{f.name}`", f.extent, "per env" if f.per_env else "per column",
               "as sent" if f.batch_dtype == AS_SENT else
               "not in the batch" if f.batch_dtype is None else str(f.batch_dtype), f.doc)
              for f in CHUNK_FIELDS]
    kinds = [(f"`{k.name}`", f"`{k.entry}`" + (f" (some configs: `{k.variant[1]}`)"
                                                 if k.variant else ""),
              "yes" if k.per_policy else "no", k.host_role,
              "yes" if k.saves_state else "no", k.doc) for k in KINDS.values()]
    return "\n".join([
        "# Dataflow tables", "", GENERATED, "",
        "The streams, the chunk and the worker kinds, as the code declares them. "
        "[Architecture](../architecture.md) explains how they fit together.", "",
        "## Streams", "", "From `STREAMS` in `srl_jax/dataflow/stream_table.py`. A key under "
        "`<policy>/` is the policy's own (the `default` policy keeps the plain key).", "",
        *table(("stream", "binder (socket)", "connecters (socket)", "message kinds",
                "name-service key", "what travels"), streams), "",
        "## Chunk fields", "", "From `CHUNK_FIELDS` in `srl_jax/dataflow/chunk_spec.py`: the "
        "rows of a chunk of T steps, and how each field reaches the learner's batch.", "",
        *table(("field", "rows", "columns", "in the batch as", "holds"), fields), "",
        "## Worker kinds", "", "From the registry of `srl_jax/dataflow/worker_kinds.py` "
        "(`register_kind`), as a run of this checkout has them.", "",
        *table(("kind", "class", "per policy", "host role", "saves state", "does"), kinds), "",
        "## Plans", "", "What `python -m srl_jax.launch EXP --plan` prints for some shipped "
        "experiments (srl_jax/dataflow/plan.py): the workers, the streams between them and "
        "what carries each. Heartbeats (stats) and names are left out of the drawings.", "",
        *plan_sections(),
        "## Layers", "", "From `FOLDERS` in `tests/layers.py`, bottom to top: a module may "
        "import its own folder and those named here, and no third-party package its folder "
        "forbids (the standard library is always allowed). Which modules may import JAX is "
        "a rule per module (`JAX_FREE` there), not a folder's.",
        "", *table(("folder", "holds", "may also import", "third-party packages it must not "
                    "import"), layer_rows()), ""])


def metrics_page() -> str:
    return "\n".join([
        "# Metrics keys", "", GENERATED, "",
        "Every counter each worker kind sends with its heartbeats, from its declaration in "
        "`srl_jax/dataflow/metrics_table.py` (or beside its `register_kind` call): its unit, how "
        "it adds up across workers and restarts, and the rows of `metrics.jsonl` it becomes. "
        "`{policy}` stands for a policy's (or population member's) name. "
        "[Metrics and analysis](../metrics.md) says which to read for what.", "",
        "## Counters and rows", "", metrics_reference_markdown()])


def registries_page() -> str:
    def codes(names: tuple[str, ...] | list[str]) -> str:
        return ", ".join(f"`{name}`" for name in names) or "-"

    algorithms = [algorithm(name) for name in BUILT_IN]
    return "\n".join([
        "# Algorithms and env families", "", GENERATED, "",
        "## Algorithms", "", "The built-in algorithms of `srl_jax/dataflow/algorithms.py` "
        "(`BUILT_IN`; a plugin adds its own with `register`). Each one's hyperparameters are "
        "its section `learner.<name>` of [Config keys](config.md); how to write one is in "
        "[Architecture](../architecture.md#algorithms).", "",
        *table(("`learner.algorithm`", "config", "learns from", "network heads",
                "live hyperparameters", "batch fields it reads"),
               [(f"`{a.name}`", f"`{a.config.__name__}`", f"`{a.source}` stream", codes(a.heads),
                 codes(a.live), codes(a.fields)) for a in algorithms]), "",
        "## Env families", "", "The table of `srl_jax/config/env_families.py`: which "
        "`env.id`s each family takes (the longest matching pattern wins), the implementation "
        "that steps it for each `env.backend`, and the extras that install its packages. "
        "[Environments](../environments.md) describes each.", "",
        *table(("family", "`env.id` patterns", "backends", "multi-agent", "extras"),
               [(f"`{f.name}`", codes(f.ids), ", ".join(
                   f"`{backend}`: `{impl}`" for backend, impl in f.implementations.items()),
                 "yes" if f.multi_agent else "no", codes(f.extras)) for f in families()]), ""])


def home_page() -> str:
    return (REPOSITORY / "README.md").read_text().replace("](docs/", "](")


PAGES: dict[str, Callable[[], str]] = {"index.md": home_page,
                                       "reference/config.md": config_page,
                                       "reference/dataflow.md": dataflow_page,
                                       "reference/metrics.md": metrics_page,
                                       "reference/registries.md": registries_page}
"""Generated page (its path in the site's docs) -> what renders it."""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files
