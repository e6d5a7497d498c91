"""Plots of runs loaded by srl_jax.analysis.runs: learning curves with a band over seeds, and
a population's members with the exploits that joined them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from srl_jax.analysis.runs import RETURN, config_column, curves

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def plot_population(df: pd.DataFrame, lineage: pd.DataFrame | None = None,
                    x: str = "time", y: str = RETURN, ax: Axes | None = None) -> Axes:
    """Each member's curve (`load_population`), and each exploit of `lineage` as an
    arrow from the donor's curve to the member's at the moment of the copy."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    colors, series = {}, {}
    for member, rows in df.groupby("member", sort=True):
        points = rows[[x, y]].dropna()
        line, = ax.plot(points[x], points[y], label=member, linewidth=1.5)
        colors[member], series[member] = line.get_color(), points
    for _, event in (lineage if lineage is not None else pd.DataFrame()).iterrows():
        at = {m: np.interp(event["time"], s[x], s[y]) if len(s) else np.nan
              for m, s in series.items() if m in (event["member"], event["donor"])}
        if x == "time" and len(at) == 2:
            ax.annotate("", xy=(event["time"], at[event["member"]]),
                        xytext=(event["time"], at[event["donor"]]),
                        arrowprops={"arrowstyle": "->", "color": colors[event["member"]]})
    ax.set_xlabel(_LABELS.get(x, x))
    ax.set_ylabel(_LABELS.get(y, y))
    ax.set_title("population members (arrows: a member copies a donor)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    return ax


def _next_to(mask: np.ndarray) -> np.ndarray:
    """`mask` and its neighbours, so that a stretch drawn from it joins the line beside it."""
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    return out


_LABELS = {"env_frames": "environment frames", "time": "wall time (s)",
           RETURN: "episode return (mean)", "fps": "env frames per second"}


def plot_curves(df: pd.DataFrame, x: str = "env_frames", y: str = RETURN,
                by: str | None = None, ax: Axes | None = None, band: str | None = "ci95",
                points: int = 200, span: str = "all", show_runs: bool = False) -> Axes:
    """One mean curve per group of `by` (a config key) with its band; see `curves`.

    Draws on `ax` (a new figure when None) and returns it, with axes labelled
    and a legend naming each group and its number of runs. `show_runs` also
    draws each run's own points as a thin line in its group's colour. With the
    default `span="all"`, the mean is a thick line only where all the group's
    runs (those with data) count; where only some of them do, it is the mean
    of those, dotted, since it jumps where a run starts or stops (against wall
    time runs often start learning at different moments); where none does, it
    breaks. Runs that never overlap are thus drawn side by side, dotted. The
    band is drawn where two or more runs count.
    """
    import matplotlib.pyplot as plt

    data = curves(df, x=x, y=y, by=by, band=band, points=points, span=span)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    column = config_column(df, by) if by is not None else None
    any_partial = False
    for group, rows in data.groupby("group", sort=True, dropna=False):
        selected = df[df[column] == group] if column else df
        runs = selected["run"].nunique()
        counted = rows["n"].to_numpy()
        full = counted == selected[["run", x, y]].dropna()["run"].nunique()
        mean = rows["mean"].to_numpy()
        if column:
            label = f"{by}={group} ({runs} run{'s' if runs != 1 else ''})"
        else:
            names = ", ".join(sorted(map(str, selected["experiment"].dropna().unique())))
            label = f"{names or 'runs'} (mean of {runs})" if runs > 1 else names or "run"
        line, = ax.plot(rows["x"], np.where(full, mean, np.nan), label=label, linewidth=2)
        some = ~full & (counted > 0)
        if some.any():
            any_partial = True
            joined = _next_to(some) & (counted > 0)
            ax.plot(rows["x"], np.where(joined, mean, np.nan), color=line.get_color(),
                    linewidth=1.5, linestyle=":", label="_nolegend_")
        if show_runs:
            for _, run in selected[["run", x, y]].dropna().groupby("run"):
                ax.plot(run[x], run[y], color=line.get_color(), linewidth=0.8, alpha=0.5,
                        linestyle="--", label="_nolegend_")
        lo, hi = rows["lo"].to_numpy(), rows["hi"].to_numpy()
        shown = np.isfinite(lo) & np.isfinite(hi)
        if shown.any():
            ax.fill_between(rows["x"], lo, hi, where=shown, color=line.get_color(), alpha=0.25,
                            linewidth=0)
    if any_partial:
        ax.plot([], [], color="gray", linewidth=1.5, linestyle=":",
                label="mean where not all runs have data")
    if show_runs:
        ax.plot([], [], color="gray", linewidth=0.8, linestyle="--", label="single runs")
    ax.set_xlabel(_LABELS.get(x, x))
    ax.set_ylabel(_LABELS.get(y, y))
    title = {"ci95": "mean, 95% confidence band", "std": "mean +/- one std"}.get(band or "")
    ax.set_title(f"{_LABELS.get(y, y)} ({title or 'mean'} over runs)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    return ax
