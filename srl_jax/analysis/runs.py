"""Runs as DataFrames: one or many run directories loaded into pandas (one row per metrics
row, the run's flattened config as `config.<dotted.key>` columns), and the usual questions
answered by small pure functions over them: `summarize` one run, `compare` runs grouped by
a config key, `curves` with a mean and a confidence band over seeds."""

from __future__ import annotations

import glob
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from srl_jax.runtime.run_dir import read_metrics, read_status

try:
    import pandas as pd
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("srl_jax.analysis needs pandas and matplotlib: "
                      "pip install srl-jax[analysis]") from error

RETURN = "episode_return_mean"
CONFIG_PREFIX = "config."

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; above 30, 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# ---------------------------------------------------------------- loading


def flatten_config(config: Mapping[str, Any], prefix: str = CONFIG_PREFIX) -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"config.a.b": 1}`; lists and empty dicts become JSON strings."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, Mapping | list | tuple):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = value
    return flat


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """One run's metrics rows, with `run`, `experiment`, `status.*` and `config.*` columns.

    `status.state`, `status.stop_reason` and `status.restarts` (summed over
    workers) come from status.json when it is there.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    config = config if isinstance(config, dict) else {}
    status = read_status(run_dir) or {}
    workers = status.get("workers") or []
    info: dict[str, Any] = {
        "run": str(run_dir),
        "experiment": status.get("experiment") or config.get("name") or run_dir.name,
        "status.state": status.get("state"),
        "status.stop_reason": status.get("stop_reason"),
        "status.restarts": sum(int(w.get("restarts", 0) or 0) for w in workers) if workers
        else None,
        **flatten_config(config),
    }
    frame = pd.DataFrame(read_metrics(run_dir))
    for column in ("time", "env_frames", "fps", RETURN):
        if column not in frame:
            frame[column] = np.nan
    extra = pd.DataFrame({k: [v] * len(frame) for k, v in info.items()}, index=frame.index)
    return pd.concat([extra, frame], axis=1)


def _member_rows(run: pd.DataFrame, member: str) -> pd.DataFrame:
    """A population run's rows as one member sees them: its return, frames and version
    under the plain names, its live hyperparameters as `hp.<name>`."""
    prefix, learner = f"policy/{member}/", f"learner/{member}/hp/"
    rows = pd.DataFrame({"time": run["time"]}, index=run.index)
    for name in (RETURN, "env_frames", "policy_version"):
        rows[name] = run.get(prefix + name, np.nan)
    rows["learner_steps"], rows["fps"] = rows["policy_version"], np.nan
    for column in run.columns:
        if column.startswith(learner):
            rows["hp." + column[len(learner):]] = run[column]
    return rows


def load_population(run_dir: str | Path) -> pd.DataFrame:
    """A population run (or a sweep) as one run per member: `run` is `<run_dir>:<member>`,
    `member` names it, `env_frames`, `episode_return_mean` and `learner_steps` are the
    member's own, `hp.<name>` its live hyperparameters over time, and the `config.*`
    columns hold its start values, so `compare(df, key)` ranks a sweep's values."""
    from srl_jax.config.loader import config_from_dict
    from srl_jax.config.population import initial_hyperparams

    run = load_run(run_dir)
    members = int(_first(run, f"{CONFIG_PREFIX}population.members") or 0)
    if not members:
        raise ValueError(f"{run_dir} is no population run (population.members is 0)")
    config = config_from_dict(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()))
    info = [c for c in run.columns if c.startswith((CONFIG_PREFIX, "status.")) or
            c in ("experiment",)]
    frames = []
    for member, start in initial_hyperparams(config).items():
        labels = pd.DataFrame({"run": f"{run_dir}:{member}", "member": member}, index=run.index)
        starts = pd.DataFrame({CONFIG_PREFIX + key: value for key, value in start.items()},
                              index=run.index)
        shared = run[[c for c in info if c not in starts]]
        frames.append(pd.concat([labels, _member_rows(run, member), shared, starts], axis=1))
    return pd.concat(frames, ignore_index=True)


def load_lineage(run_dir: str | Path) -> pd.DataFrame:
    """A population run's exploit events (`population.jsonl`), one row each: `time` (s
    since the run started), `member`, `donor`, `donor_step`, `version`, and the new
    values as `hp.<key>`."""
    from srl_jax.config.population import read_lineage

    events = read_lineage(run_dir)
    status = read_status(Path(run_dir)) or {}
    started = status.get("started", min((e["time"] for e in events), default=0.0))
    records = [{
        "time": event["time"] - started, "member": event["member"], "donor": event["donor"],
        "donor_step": event["donor_step"], "version": event["version"],
        **{f"hp.{key}": value for key, value in event["hyperparams"].items()},
    } for event in events]
    return pd.DataFrame(records) if records else pd.DataFrame(
        columns=["time", "member", "donor", "donor_step", "version"])


def _expand(item: str | Path) -> list[Path]:
    path = Path(item)
    if path.is_dir():
        if (path / "metrics.jsonl").exists():
            return [path]
        return sorted(p.parent for p in path.rglob("metrics.jsonl"))
    return [q for match in sorted(glob.glob(str(item), recursive=True)) for q in _expand(match)]


def load_runs(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Many runs in one DataFrame.

    Each item is a run directory, a parent directory (every directory below it
    that holds metrics.jsonl, recursively) or a glob pattern.
    """
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    run_dirs = list(dict.fromkeys(p.resolve() for item in items for p in _expand(item)))
    if not run_dirs:
        raise FileNotFoundError(f"no run directory (with metrics.jsonl) in {items}")
    return pd.concat([load_run(p) for p in run_dirs], ignore_index=True)


# ---------------------------------------------------------------- summaries


def config_column(df: pd.DataFrame, key: str) -> str:
    """The column of a config key: `actors.count` or `config.actors.count`."""
    for name in (key, f"{CONFIG_PREFIX}{key}"):
        if name in df.columns:
            return name
    raise KeyError(f"no column {key!r} or {CONFIG_PREFIX}{key!r}")


def _one_run(run: str | Path | pd.DataFrame) -> pd.DataFrame:
    df = run if isinstance(run, pd.DataFrame) else load_run(run)
    if "run" in df and df["run"].nunique() > 1:
        raise ValueError(f"summarize takes one run; got {df['run'].nunique()} (see summary_table)")
    return df


def _first(df: pd.DataFrame, column: str) -> Any:
    if column not in df or df.empty:
        return None
    value = df[column].iloc[0]
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def summarize(run: str | Path | pd.DataFrame, target: float | None = None,
              metric: str = RETURN, last: int = 3, warmup_rows: int = 1) -> dict[str, Any]:
    """The figures of one run (a run directory or its `load_run` frame).

    - `final`: mean of `metric` over the last `last` rows that have it; `max`: its maximum.
    - `target`, `frames_to_target`, `time_to_target`: the first row where
      `metric` >= target (default target: the run's `stop.target_return`);
      NaN when it never got there or there is no target.
    - `fps_median`: median `fps` over the rows with env frames, leaving out the
      first `warmup_rows` of them (start-up and compilation make them slow).
    - `env_frames`, `learner_steps`, `time`: the last row's.
    - `restarts`: worker restarts (status.json sum, else `system/restarts` max).
    - `state`, `stop_reason`: from status.json.
    """
    df = _one_run(run).sort_values("time", kind="stable")
    if target is None:
        target = _first(df, f"{CONFIG_PREFIX}stop.target_return")
    values = df[metric].dropna() if metric in df else pd.Series(dtype=float)
    reached = df[df[metric] >= target] if target is not None and metric in df else df.iloc[:0]
    running = df[df["env_frames"].fillna(0) > 0]["fps"].dropna()
    steady = running.iloc[warmup_rows:] if len(running) > warmup_rows else running
    restarts = _first(df, "status.restarts")
    if restarts is None and "system/restarts" in df:
        restarts = df["system/restarts"].max()
    last_row = df.iloc[-1] if len(df) else pd.Series(dtype=float)
    return {
        "run": _first(df, "run"),
        "experiment": _first(df, "experiment"),
        "rows": len(df),
        "final": float(values.tail(last).mean()) if len(values) else math.nan,
        "max": float(values.max()) if len(values) else math.nan,
        "target": math.nan if target is None else float(target),
        "frames_to_target": float(reached["env_frames"].iloc[0]) if len(reached) else math.nan,
        "time_to_target": float(reached["time"].iloc[0]) if len(reached) else math.nan,
        "fps_median": float(steady.median()) if len(steady) else math.nan,
        "env_frames": float(last_row.get("env_frames", math.nan)),
        "learner_steps": float(last_row.get("learner_steps", math.nan)),
        "time": float(last_row.get("time", math.nan)),
        "restarts": None if restarts is None else int(restarts),
        "state": _first(df, "status.state"),
        "stop_reason": _first(df, "status.stop_reason"),
    }


def summary_table(df: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
    """`summarize` for every run in `df`, one row each, indexed by run; kwargs go to it."""
    rows = [summarize(group, **kwargs) for _, group in df.groupby("run", sort=False)]
    return pd.DataFrame(rows).set_index("run")


def compare(df: pd.DataFrame, key: str, metric: str = RETURN, target: float | None = None,
            last: int = 3) -> pd.DataFrame:
    """One row per value of config `key`, over the runs that have it.

    Columns: `runs`, `final_mean` and `final_std` (of each run's final
    `metric`, see `summarize`), `max_mean`, `reached` (runs that reached the
    target), `frames_to_target` and `time_to_target` (mean over those runs),
    `fps_median` (median of the runs' median fps).
    """
    column = config_column(df, key)
    per_run = df.groupby("run", sort=False)[column].first()
    table = summary_table(df, target=target, metric=metric, last=last)
    table[key] = per_run.reindex(table.index)
    grouped = table.groupby(key, sort=True, dropna=False)
    return pd.DataFrame({
        "runs": grouped.size(),
        "final_mean": grouped["final"].mean(),
        "final_std": grouped["final"].std(ddof=1),
        "max_mean": grouped["max"].mean(),
        "reached": grouped["frames_to_target"].count(),
        "frames_to_target": grouped["frames_to_target"].mean(),
        "time_to_target": grouped["time_to_target"].mean(),
        "fps_median": grouped["fps_median"].median(),
    })


# ---------------------------------------------------------------- curves


def t_quantile(dof: int) -> float:
    """Two-sided 95% quantile of Student's t with `dof` degrees of freedom."""
    if dof < 1:
        return math.nan
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def _interpolate(run: pd.DataFrame, x: str, y: str, grid: np.ndarray) -> np.ndarray:
    """The run's `y` at the grid points inside its own x range; NaN outside it."""
    points = run[[x, y]].dropna().sort_values(x, kind="stable").drop_duplicates(x, keep="last")
    out = np.full(grid.shape, np.nan)
    if points.empty:
        return out
    xs, ys = points[x].to_numpy(float), points[y].to_numpy(float)
    inside = (grid >= xs[0]) & (grid <= xs[-1])
    out[inside] = np.interp(grid[inside], xs, ys)
    return out


def curves(df: pd.DataFrame, x: str = "env_frames", y: str = RETURN, by: str | None = None,
           band: str | None = "ci95", points: int = 200, span: str = "all") -> pd.DataFrame:
    """Mean curve of `y` against `x` over the runs of each group, with a band.

    Each run is interpolated linearly onto a grid of `points` x values, only
    within its own x range: never extrapolated. `span="all"` (the default)
    spans the union of the group's runs, and each point averages the runs that
    reach it, so runs that do not overlap (against time, runs whose start-up
    took different times often do not) each keep their own stretch of the
    curve, with a gap (`n` = 0, `mean` NaN) between them. `span="common"`
    puts the grid where all the group's runs have data (from the latest first
    x to the earliest last x), so every point averages the same runs; it
    raises ValueError, naming each run's range, when they share none. At each
    point: `n` (runs there), `mean`, and `lo`/`hi`: mean -/+ t(0.975, n-1) *
    std / sqrt(n) for `band="ci95"`, mean -/+ std for `"std"`; NaN where n < 2
    or `band` is None. Rows where `y` is missing (no episode finished in that
    window) are left out first. Returns columns `group`, `x`, `n`, `mean`,
    `lo`, `hi`.
    """
    if band not in ("ci95", "std", None):
        raise ValueError(f"band must be 'ci95', 'std' or None, not {band!r}")
    if span not in ("common", "all"):
        raise ValueError(f"span must be 'common' or 'all', not {span!r}")
    column = config_column(df, by) if by is not None else None
    keys = df[column] if column else pd.Series("all", index=df.index)
    frames = []
    for group, rows in df.groupby(keys, sort=True, dropna=False):
        valid = rows[["run", x, y]].dropna()
        if valid.empty:
            continue
        ranges = valid.groupby("run")[x].agg(["min", "max"])
        if span == "common":
            start, stop = ranges["min"].max(), ranges["max"].min()
            if start > stop:
                spans = "; ".join(f"{Path(str(run)).name} {low:g} to {high:g}"
                                  for run, (low, high) in ranges.iterrows())
                raise ValueError(f"span='common': the runs of group {group!r} share no {x!r} "
                                 f"with {y!r} ({spans}); span='all' draws each where it has "
                                 "data")
        else:
            start, stop = ranges["min"].min(), ranges["max"].max()
        grid = np.linspace(start, stop, points)
        stack = np.array([_interpolate(run, x, y, grid) for _, run in valid.groupby("run")])
        n = np.sum(np.isfinite(stack), axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.nansum(stack, axis=0) / np.where(n > 0, n, np.nan)
            std = np.sqrt(np.nansum((stack - mean) ** 2, axis=0) / np.where(n > 1, n - 1, np.nan))
        if band == "ci95":
            half = np.array([t_quantile(k - 1) for k in n]) * std / np.sqrt(n)
        elif band == "std":
            half = std
        else:
            half = np.full(grid.shape, np.nan)
        frames.append(pd.DataFrame({"group": group, "x": grid, "n": n, "mean": mean,
                                    "lo": mean - half, "hi": mean + half}))
    if not frames:
        raise ValueError(f"no run has both {x!r} and {y!r}")
    return pd.concat(frames, ignore_index=True)
