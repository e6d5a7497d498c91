"""The compared systems' figures over the rounds: medians and ranges, srl_jax / peer ratios
round by round, and the tables printed."""

from __future__ import annotations

import statistics
from typing import Any

from bench.peers.rounds import RunFigures
from bench.peers.systems import ROLLING_WINDOWS


def spread(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def ratio_rounds(runs: dict[str, list[RunFigures]], ours: str, peer: str,
                 key: str) -> list[float]:
    """ours / peer of one figure, round by round (a round missing either side is left out)."""
    ratios = []
    for a, b in zip(runs[ours], runs[peer], strict=True):
        x, y = a.figure(key), b.figure(key)
        if x is not None and y:
            ratios.append(x / y)
    return ratios


def cell(summary: dict[str, float] | None, spec: str) -> str:
    if summary is None:
        return "-"
    return (f"{format(summary['median'], spec)} [{format(summary['min'], spec)}-"
            f"{format(summary['max'], spec)}]")


def print_table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


def window_figures(results: list[RunFigures]) -> list[str]:
    """The window figures (`time_to_target_last20_s`, ...) the runs have, in order."""
    return list(dict.fromkeys(name for r in results for name in r.windows))


def system_summaries(runs: dict[str, list[RunFigures]]) -> dict[str, Any]:
    """Each system's figures over the rounds (a window's `n`: the runs that reached it)."""
    return {name: {"fps": spread([r.fps for r in results]),
                   "startup_s": spread([r.startup_s for r in results]),
                   "time_to_target_s": spread([r.time_to_target_s for r in results]),
                   "frames_to_target": spread([r.frames_to_target for r in results]),
                   "solved": sum(r.time_to_target_s is not None for r in results),
                   **{figure: spread([r.figure(figure) for r in results])
                      for figure in window_figures(results)},
                   "runs": [r.as_dict() for r in results]} for name, results in runs.items()}


RATIO_FIGURES = {"fps": "fps_ratio", "time_to_target_s": "time_to_475_ratio",
                 "frames_to_target": "frames_to_475_ratio",
                 **{f"time_to_target_{w}_s": f"time_to_475_{w}_ratio" for w in ROLLING_WINDOWS},
                 **{f"frames_to_target_{w}": f"frames_to_475_{w}_ratio" for w in ROLLING_WINDOWS}}
"""RunFigures field -> the name of its srl_jax / peer ratio in the results."""
