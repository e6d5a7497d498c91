"""The run directory's layout, read without JAX: runs, checkpoints, metrics rows, status.

The controller and the launcher use this to find what to resume; the learner
writes checkpoints through `learners.training.checkpoint` (orbax). Checkpoints live where
`checkpoint.dir` says (`srl_jax.config.checkpoint_location`: `<run_dir>/checkpoints/` by
default, or a path or bucket of the user's); the helpers here take that setting
as `location`. A save torn by a kill never looks like a complete step here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from srl_jax.config.checkpoint_location import (
    check_format,
    checkpoint_location,
    seen_here,
    steps_in,
)
from srl_jax.config.loader import config_from_dict
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, ExperimentConfig, run_policies

if TYPE_CHECKING:
    from etils import epath

BEST = "best"
EVALUATED = "evaluated"
POOL = "pool"
METRICS = "metrics.jsonl"
DISCARDED_METRICS = "metrics.discarded.jsonl"
STATUS = "status.json"
"""The controller's view of the run (workers, ports, state), rewritten every log interval."""
STATUS_READ_TRIES = 5


def read_run_config(run_dir: Path) -> ExperimentConfig:
    """The resolved config a run was started with."""
    return parse_run_config((Path(run_dir) / "config.yaml").read_text())


def parse_run_config(text: str) -> ExperimentConfig:
    """A run's `config.yaml` text (as the network name service hands it out) as a config."""
    return config_from_dict(yaml.safe_load(text))


def checkpoint_root(run_dir: Path, best: bool = False, policy: str = DEFAULT_POLICY,
                    location: str = "") -> epath.Path:
    """The checkpoint location (`checkpoint.dir`, given as `location`; by default
    `<run_dir>/checkpoints/`), or its `<policy>/` for each policy of a multi-policy run."""
    root = checkpoint_location(run_dir, location)
    if policy != DEFAULT_POLICY:
        root = root / policy
    return root / BEST if best else root


def evaluated_root(run_dir: Path, policy: str = DEFAULT_POLICY,
                   location: str = "") -> epath.Path:
    """Where the evaluator keeps `policy`'s parameters of its best evaluation."""
    return checkpoint_root(run_dir, policy=policy, location=location) / EVALUATED


def pool_root(run_dir: Path, policy: str, location: str = "") -> epath.Path:
    """Where `policy`'s learner keeps the snapshots of its opponent pool
    (`srl_jax.config.opponent_pool`)."""
    return checkpoint_root(run_dir, policy=policy, location=location) / POOL


def checkpoint_steps(run_dir: Path, best: bool = False, policy: str = DEFAULT_POLICY,
                     location: str = "") -> list[int]:
    """Steps of the complete checkpoints, oldest first."""
    return steps_in(checkpoint_root(run_dir, best, policy, location))


def checkpoint_meta(run_dir: Path, step: int, best: bool = False,
                    policy: str = DEFAULT_POLICY, location: str = "") -> dict[str, Any]:
    """The JSON the learner saved beside its state (counters, config, save time)."""
    return step_meta(checkpoint_root(run_dir, best, policy, location), step)


def step_meta(root: epath.Path | Path, step: int) -> dict[str, Any]:
    """The `meta` item (JSON) of step `step` under `root`; CheckpointFormatError when the
    step is in another checkpoint format than this srl_jax's (`check_format`)."""
    meta = json.loads((root / str(step) / "meta" / "metadata").read_text())
    check_format(meta, f"checkpoint step {step} in {root}")
    return meta


def check_formats(run_dir: Path, config: ExperimentConfig, steps: dict[str, int]) -> None:
    """CheckpointFormatError when a step of `steps` (policy -> step) is in another
    checkpoint format than this srl_jax's, ConfigError when its meta cannot be read, where
    this host sees the checkpoints (elsewhere the learners find out as they restore)."""
    location = config.checkpoint.dir
    if not seen_here(checkpoint_location(run_dir, location)):
        return
    for policy, step in steps.items():
        try:
            checkpoint_meta(run_dir, step, policy=policy, location=location)
        except (OSError, json.JSONDecodeError) as error:
            root = checkpoint_root(run_dir, policy=policy, location=location)
            raise ConfigError(f"'--resume': checkpoint step {step} in {root} has no readable "
                              f"meta ({error})") from None


def latest_resumable_run(runs_root: Path, experiment: str) -> Path | None:
    """The newest run of `experiment` under `runs_root` that holds a complete checkpoint."""
    parent = Path(runs_root) / experiment
    if not parent.is_dir():
        return None
    runs = sorted((p for p in parent.iterdir() if p.is_dir()), key=lambda p: p.name,
                  reverse=True)
    return next((run for run in runs if _has_checkpoint(run)), None)


def _has_checkpoint(run_dir: Path) -> bool:
    """A complete checkpoint of the default policy, or of any policy of a multi-policy run."""
    try:
        return bool(newest_steps(run_dir, read_run_config(run_dir)))
    except (OSError, ValueError, yaml.YAMLError):  # no config.yaml, or damaged files
        return False


def newest_steps(run_dir: Path, config: ExperimentConfig) -> dict[str, int]:
    """Each policy's newest complete checkpoint step (a policy without one left out).

    Read where the checkpoints are when this host sees that location; otherwise (a
    directory on the learner's own host) the step the learners last reported
    (`learner/checkpoint_step`, `policy/<name>/checkpoint_step`) in metrics.jsonl. A
    save that a kill tore leaves that figure a step ahead of what the learner restores.
    A ValueError names a damaged metrics.jsonl.
    """
    location = config.checkpoint.dir
    if seen_here(checkpoint_location(run_dir, location)):
        saved = {policy: checkpoint_steps(run_dir, policy=policy, location=location)
                 for policy in run_policies(config)}
        return {policy: steps[-1] for policy, steps in saved.items() if steps}
    recorded: dict[str, int] = {}
    for row in read_metrics(run_dir):
        for policy in run_policies(config):
            if (step := row.get(checkpoint_step_key(policy))) is not None:
                recorded[policy] = step
    return recorded


def checkpoint_step_key(policy: str) -> str:
    """The metrics key of `policy`'s newest checkpoint step."""
    return "learner/checkpoint_step" if policy == DEFAULT_POLICY else \
        f"policy/{policy}/checkpoint_step"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl. A torn last line (a run killed mid-write) is skipped; a
    bad line anywhere else is damage, and a ValueError names it."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({error.msg})") from error
    return rows


def policy_version(row: dict[str, Any], policy: str) -> int:
    """`policy`'s version in a metrics row (the default policy's is `learner_steps`)."""
    key = "learner_steps" if policy == DEFAULT_POLICY else f"policy/{policy}/policy_version"
    return row.get(key, 0)


def trim_metrics(run_dir: Path, steps: dict[str, int]) -> dict[str, Any] | None:
    """Keep the rows up to the checkpoints' steps (policy -> step); return the last one kept.

    Rows written after a checkpoint describe training the resume throws away;
    they move to metrics.discarded.jsonl, so metrics.jsonl never goes back and
    nothing is lost.
    """
    try:
        rows = read_metrics(run_dir)
    except ValueError as error:
        raise ConfigError(f"'--resume': {error}") from None
    cut = len(rows)
    while cut and any(policy_version(rows[cut - 1], policy) > step
                      for policy, step in steps.items()):
        cut -= 1
    kept, dropped = rows[:cut], rows[cut:]
    if dropped:
        with open(Path(run_dir) / DISCARDED_METRICS, "a") as out:
            out.writelines(json.dumps(row) + "\n" for row in dropped)
    path = Path(run_dir) / METRICS
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
    tmp.replace(path)
    return kept[-1] if kept else None


READABLE_WORKERS = 256
"""Up to this many workers status.json is indented for people; past it, compact (json's
C encoder, ten times faster: the controller writes it every second)."""


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Replace status.json atomically: a reader sees the old file or the new one."""
    path = Path(run_dir) / STATUS
    tmp = path.with_suffix(".json.tmp")
    readable = len(status.get("workers", ())) <= READABLE_WORKERS
    tmp.write_text(json.dumps(status, indent=1 if readable else None))
    tmp.replace(path)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's status.json, or None if there is none (not a run directory, or its
    controller has not started) or it does not hold a JSON object.

    A file system that shows a replaced file torn (NFS) gets a few more tries.
    """
    path = Path(run_dir) / STATUS
    for attempt in range(STATUS_READ_TRIES):
        try:
            status = json.loads(path.read_text())
        except OSError:
            return None
        except json.JSONDecodeError:
            if attempt + 1 < STATUS_READ_TRIES:
                time.sleep(0.05)
            continue
        return status if isinstance(status, dict) else None
    return None
