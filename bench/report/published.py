"""The published-results table: what each anchored config reached at the env steps it got
to, beside the published figure at those steps (`bench.peers.published`), from
`bench.configs`' results."""

from __future__ import annotations

import statistics
from typing import Any

from bench.peers.published import PUBLISHED, Anchor
from bench.report.markdown import number, table


def _spec(metric: str) -> str:
    return ".2f" if "win" in metric else ",.1f"


def final_of(run: dict[str, Any], metric: str) -> float | None:
    """A run's final `metric` (mean of its last rows): `final_return` where the run was
    measured by that metric, else `final_<metric>`; None where it was not recorded."""
    if run.get("target_metric") == metric:
        return run["final_return"]
    return run.get(f"final_{metric}")


def _ours(runs: list[dict[str, Any]], metric: str) -> str:
    values = [v for run in runs if (v := final_of(run, metric)) is not None]
    if not values:
        return f"- (no `{metric}` recorded)"
    spec = _spec(metric)
    if len(values) == 1:
        return number(values[0], spec)
    return (f"{number(statistics.median(values), spec)} ({number(min(values), spec)}-"
            f"{number(max(values), spec)})")


def _published(anchor: Anchor, steps: float, metric: str) -> str:
    value = anchor.at(steps)
    if value is not None:
        return f"{number(value, _spec(metric))} ({anchor.source})"
    first, last = anchor.span
    if first == last:  # a final value alone
        return (f"{anchor.source}: {number(anchor.points[0][1], _spec(metric))} at "
                f"{last / 1e6:g}M only")
    where = "beyond" if steps > last else "before"
    return f"{where} the published curve ({anchor.source}: {first / 1e6:g}-{last / 1e6:g}M)"


def published_row(name: str, entry: dict[str, Any]) -> list[str]:
    held = PUBLISHED[name]
    runs = entry["runs"]
    steps = statistics.median(run["env_frames"] for run in runs)
    cell = "; ".join(_published(anchor, steps, held.metric) for anchor in held.anchors)
    return [f"`{name}`", f"`{held.metric}`", _ours(runs, held.metric),
            f"{steps / 1e6:,.2f}M", cell or "- (see below)",
            f"{statistics.median(run['time_s'] for run in runs):,.0f} s", str(len(runs))]


def sources(names: list[str]) -> list[str]:
    """One line per anchor (where it is, what it measures, how it was read) and per note."""
    lines = []
    for name in names:
        held = PUBLISHED[name]
        lines += [f"- `{name}`, {a.source}: {a.reference}. Measures the {a.definition}. "
                  f"Read: {a.read}." for a in held.anchors]
        if held.note:
            lines.append(f"- `{name}`: {held.note}.")
    return lines


def published(result: dict[str, Any]) -> list[str]:
    """The table for the configs of `result` (configs.json) that `PUBLISHED` names."""
    entries = result["configs"]
    names = [name for name in PUBLISHED if entries.get(name, {}).get("runs")]
    if not names:
        return ["*No config with a published anchor has results in "
                "`bench/results/configs.json` yet.*"]
    cores = sorted({entries[name]["machine"]["cores"] for name in names})
    lines = table(["config", "metric", "ours: final (median, min-max)", "at env steps (median)",
                   "published at those steps", f"wall time on {'/'.join(map(str, cores))} "
                   "cores (median)", "runs"],
                  [published_row(name, entries[name]) for name in names])
    return [*lines, "", "*Final: mean of the last 10 metrics rows of a run. Published "
            "values are interpolated linearly in env steps between the points read off "
            "each source; none outside them.*", "", *sources(names)]
