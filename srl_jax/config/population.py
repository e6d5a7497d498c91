"""Population-based training as pure functions: draws, start values, ranking, explore.

A population run trains `population.members` whole pipelines side by side, each
under its own policy name (m0, m1, ...), each with its own hyperparameters. The
population manager (`srl_jax/runtime/population_manager.py`) reads the members' returns
(their evaluation returns when the evaluator runs) in the metrics rows and, at each
member's ready point, `decide`s: a member in the bottom fraction copies a member of
the top fraction (exploit: the loser's learner loads the donor's newest checkpoint)
and perturbs or redraws its hyperparameters (explore), as in Jaderberg et al. 2017.
A sweep is a population without exploit: each member keeps the values it started
with (`sweep_overrides`).

Hyperparameters are named by their config keys, `learner.<algorithm>.<name>`, and
must be among the algorithm's live ones (`srl_jax.dataflow.algorithms.Algorithm.live`): a
learner changes them in its train state without recompiling.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from srl_jax.config.schema import ConfigError, ExperimentConfig, PopulationConfig, member_names

log = logging.getLogger(__name__)

DRAWS = ("log_uniform", "uniform")
TRAINING, EVALUATION = "episode_return_mean", "eval_return_mean"
VERSION_KEY = "policy/{member}/policy_version"
EVAL_VERSION_KEY = "policy/{member}/eval_policy_version"
LOG_NAME = "population.jsonl"
"""In the controller's run directory: one JSON line per copy a member made, the lineage."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def check_spec(key: str, spec: Any) -> None:
    """ConfigError unless `spec` is a draw: {log_uniform: [lo, hi]}, {uniform: [lo, hi]}
    or a non-empty list of numbers."""
    where = f"'population.explore.{key}'"
    if isinstance(spec, list):
        _require(bool(spec) and all(isinstance(v, int | float) for v in spec),
                 f"{where} must list at least one number")
        return
    _require(isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in DRAWS,
             f"{where} must be {{log_uniform: [lo, hi]}}, {{uniform: [lo, hi]}} or a list")
    (draw, bounds), = spec.items()
    _require(isinstance(bounds, list) and len(bounds) == 2
             and all(isinstance(v, int | float) for v in bounds) and bounds[0] < bounds[1],
             f"{where}.{draw} must be [lo, hi] with lo < hi")
    _require(draw != "log_uniform" or bounds[0] > 0, f"{where}.log_uniform needs lo > 0")


def draw(spec: Any, rng: np.random.Generator) -> float:
    """One value of a checked spec."""
    if isinstance(spec, list):
        return float(spec[rng.integers(len(spec))])
    (kind, (low, high)), = spec.items()
    if kind == "log_uniform":
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    return float(rng.uniform(low, high))


def field_name(key: str) -> str:
    """The algorithm config field a population key names: learner.ppo.ent_coef -> ent_coef."""
    return key.rsplit(".", 1)[-1]


def check_population(config: ExperimentConfig, live: Sequence[str]) -> None:
    """ConfigError (one line) for a population the run cannot train: `live` are the
    chosen algorithm's live hyperparameters."""
    pop = config.population
    if not pop.members:
        _require(not pop.explore and not pop.initial,
                 "'population.explore' and 'population.initial' need 'population.members'")
        return
    _require(pop.members >= 2, "'population.members' must be 0 (off) or at least 2")
    _require(not config.env.policies, "a population trains single-policy members: "
             "'population.members' cannot go with 'env.policies'")
    _require(config.learner.processes == 1,
             "'population.members' needs 'learner.processes' 1 (a member's learner is one "
             "process)")
    _require(pop.ready_after_updates >= 1, "'population.ready_after_updates' must be at least 1")
    _require(pop.window >= 1, "'population.window' must be at least 1")
    _require(0 < pop.exploit_fraction <= 0.5,
             "'population.exploit_fraction' must be in (0, 0.5]")
    _require(bool(pop.perturb) and all(f > 0 for f in pop.perturb),
             "'population.perturb' must list positive factors")
    _require(0 <= pop.resample_probability <= 1,
             "'population.resample_probability' must be in [0, 1]")
    _require(not pop.exploit or config.checkpoint.enabled,
             "'population.exploit' copies members through checkpoints: enable 'checkpoint'")
    prefix = f"learner.{config.learner.algorithm}."
    for section, keys in (("explore", pop.explore), ("initial", pop.initial)):
        for key in keys:
            _require(key.startswith(prefix) and field_name(key) in live and
                     key.count(".") == 2,
                     f"'population.{section}.{key}' is not a live hyperparameter of "
                     f"'{config.learner.algorithm}' (live: "
                     f"{', '.join(prefix + name for name in live) or 'none'})")
    for key, spec in pop.explore.items():
        check_spec(key, spec)
    for key, values in pop.initial.items():
        _require(len(values) == pop.members, f"'population.initial.{key}' must list "
                 f"{pop.members} values, one per member (got {len(values)})")


def member_rng(config: ExperimentConfig, *stream: int) -> np.random.Generator:
    """A reproducible generator for the population's draws and choices."""
    return np.random.default_rng([config.seed, config.population.seed, *stream])


def initial_hyperparams(config: ExperimentConfig) -> dict[str, dict[str, float]]:
    """Each member's start values of the explored and listed keys (member -> key -> value)."""
    pop = config.population
    start = {}
    for i, member in enumerate(member_names(pop.members)):
        rng = member_rng(config, 0, i)
        values = {key: draw(spec, rng) for key, spec in pop.explore.items()}
        values.update({key: float(listed[i]) for key, listed in pop.initial.items()})
        start[member] = values
    return start


def perturbed(value: float, factor: float, spec: Any) -> float:
    """`value` moved by `factor`, inside its spec: a range's value multiplied and kept within
    [lo, hi] (a 0 moved by (factor - 1) of the range, since no factor moves it); a listed
    value stepped to the neighbouring choice, up for a factor above 1, down below."""
    if isinstance(spec, list):
        choices = sorted(float(c) for c in spec)
        at = int(np.argmin([abs(c - value) for c in choices]))
        step = 1 if factor > 1 else -1 if factor < 1 else 0
        return choices[min(max(at + step, 0), len(choices) - 1)]
    (_, (low, high)), = spec.items()
    moved = value * factor if value else (factor - 1) * (high - low)
    return float(min(max(moved, low), high))


def explore(values: Mapping[str, float], pop: PopulationConfig,
            rng: np.random.Generator) -> dict[str, float]:
    """New values from a donor's: each explored key redrawn with `resample_probability`,
    else perturbed by one of `perturb` (within its spec: `perturbed`); keys not explored
    are kept."""
    new = dict(values)
    for key, spec in pop.explore.items():
        if key not in new or rng.random() < pop.resample_probability:
            new[key] = draw(spec, rng)
        else:
            factor = pop.perturb[rng.integers(len(pop.perturb))]
            new[key] = perturbed(float(new[key]), factor, spec)
    return new


@dataclass
class MemberView:
    """What the manager knows of one member."""

    name: str
    hyperparams: dict[str, float]
    version: int = 0
    """Its learner's latest policy version seen in the metrics."""
    changed_at: int = 0
    """The version its weights were last replaced at (0: never): its score counts from here."""
    ready_at: int = 0
    """The version at which it is ranked next."""
    score: float | None = None
    ranked_version: int | None = None
    """The version its score was last earned by (`ranked_version`): a loser copies the
    donor's parameters of then, not newer ones that were never ranked."""


@dataclass(frozen=True)
class Exploit:
    member: str
    donor: str
    hyperparams: dict[str, float]


def decide(views: Sequence[MemberView], pop: PopulationConfig,
           rng: np.random.Generator) -> tuple[list[Exploit], list[str]]:
    """(exploits, members ranked without a change) for the members at their ready point.

    Members are ranked by score (those without one yet are not ranked); a ready member
    among the bottom `exploit_fraction` copies one of the top `exploit_fraction`.
    """
    scores = {v.name: v.score for v in views if v.score is not None}
    scored = sorted((v for v in views if v.name in scores), key=lambda v: scores[v.name])
    cut = max(1, round(len(scored) * pop.exploit_fraction)) if len(scored) >= 2 else 0
    bottom, top = scored[:cut], scored[len(scored) - cut:]
    losers = {v.name for v in bottom} - {v.name for v in top}
    exploits, kept = [], []
    for view in views:
        if view.score is None or view.version < view.ready_at:
            continue
        if view.name in losers:
            donor = top[rng.integers(len(top))]
            exploits.append(Exploit(view.name, donor.name,
                                    explore(donor.hyperparams, pop, rng)))
        else:
            kept.append(view.name)
    return exploits, kept


def ranking_metric(config: ExperimentConfig) -> str:
    """What members are ranked by: their evaluation return when the evaluator runs
    (deterministic episodes of one version), else their training return."""
    return EVALUATION if config.evaluation.every_updates else TRAINING


def _scored(rows: Sequence[Mapping[str, Any]], member: str, since: int,
            metric: str) -> list[tuple[float, int]]:
    """(value, version) of the member's `metric` in rows of versions after `since` (for an
    evaluation return, the version it evaluated), oldest first."""
    value = f"policy/{member}/{metric}"
    version = (EVAL_VERSION_KEY if metric == EVALUATION else VERSION_KEY).format(member=member)
    return [(row[value], int(row.get(version, 0))) for row in rows
            if value in row and row.get(version, 0) > since]


def member_score(rows: Sequence[Mapping[str, Any]], member: str, since: int,
                 window: int, metric: str = TRAINING) -> float | None:
    """The mean of the member's last `window` values of `metric` in rows of versions
    after `since` (for an evaluation return, the version it evaluated)."""
    values = [value for value, _ in _scored(rows, member, since, metric)]
    return float(np.mean(values[-window:])) if values else None


def ranked_version(rows: Sequence[Mapping[str, Any]], member: str, since: int,
                   metric: str = TRAINING) -> int | None:
    """The version of the parameters that earned the member its latest score: that of the
    newest value the score counts (an evaluation's evaluated version)."""
    scored = _scored(rows, member, since, metric)
    return scored[-1][1] if scored else None


def sweep_overrides(sweeps: Sequence[str]) -> list[str]:
    """`--sweep KEY=V1,V2,...` (each key once) as config overrides: a population without
    exploit whose members take every combination of the values, in order."""
    grid = {}
    for text in sweeps:
        key, sep, values = text.partition("=")
        _require(bool(sep) and bool(values), f"'--sweep {text}' must look like KEY=V1,V2,...")
        _require(key not in grid, f"'--sweep': '{key}' is given twice")
        try:
            grid[key] = [float(v) for v in values.split(",")]
        except ValueError:
            raise ConfigError(f"'--sweep {text}': the values must be numbers") from None
    combos = list(itertools.product(*grid.values()))
    _require(len(combos) >= 2, "'--sweep' needs at least two values in all")
    initial = {key: [combo[i] for combo in combos] for i, key in enumerate(grid)}
    return [f"population.members={len(combos)}", "population.exploit=false",
            f"population.initial={initial}"]


def append_lineage(run_dir: str | Path, event: dict[str, Any]) -> None:
    """Add one exploit event to `population.jsonl`: one write of one line, so that a
    line is never split, whoever else appends; on a line of its own after one a kill
    left torn (which readers leave out)."""
    line = lineage_line(event).encode()
    fd = os.open(Path(run_dir) / LOG_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        torn = size and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, b"\n" + line if torn else line)
    finally:
        os.close(fd)


def read_lineage(run_dir: str | Path) -> list[dict[str, Any]]:
    """The exploit events of a population run (`population.jsonl`), oldest first ([]
    before the first)."""
    path = Path(run_dir) / LOG_NAME
    return parse_lineage(path.read_text()) if path.exists() else []


def parse_lineage(text: str) -> list[dict[str, Any]]:
    """Exploit events from their JSON lines, as `population.jsonl` holds them (and the
    controller sends them to the manager: srl_jax/runtime/population_link.py); a line that
    is no JSON map (one torn by a full disk or a kill) is left out."""
    events = []
    for line in filter(str.strip, text.splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            events.append(event)
        else:
            log.warning("left out a lineage line that is no JSON map: %.80s", line)
    return events


def lineage_line(event: dict[str, Any]) -> str:
    """One exploit event as its line of `population.jsonl`."""
    return json.dumps(event) + "\n"


def event_problem(event: Any, members: Sequence[str]) -> str | None:
    """Why `event` is no exploit event of a population of `members` (None: it is one)."""
    if not isinstance(event, dict):
        return "not a map"
    if event.get("member") not in members or event.get("donor") not in members:
        return f"member {event.get('member')!r} or donor {event.get('donor')!r} unknown"
    if event["member"] == event["donor"]:
        return "a member is its own donor"
    if type(event.get("version")) is not int or not finite_numbers(event.get("hyperparams")):
        return "no version, or hyperparams that are not finite numbers"
    return None


def finite_numbers(values: Any, missing: bool = False) -> TypeGuard[dict[Any, Any]]:
    """Whether `values` maps names to finite numbers (or None, where `missing`)."""
    return isinstance(values, dict) and all(
        (missing and v is None) or (isinstance(v, int | float) and math.isfinite(v))
        for v in values.values())
