"""A finished run's figures from its `metrics.jsonl` and `status.json`: the steady
frames/s with start-up left out, and where the time went."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.launcher import BenchError
from srl_jax.runtime.run_dir import read_status

SPLIT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("env", "actor/time_env_frac"),
    ("wait", "actor/time_wait_frac"),
    ("send", "actor/time_send_frac"),
    ("infer", "inference/time_compute_frac"),
    ("update", "learner/time_update_frac"),
    ("batch", "inference/batch_rows_mean"),
)
"""(table header, metrics key): mean over the steady rows of each run."""


@dataclass
class RunResult:
    index: int
    startup_s: float
    steady_s: float
    steady_frames: int
    fps: float
    splits: dict[str, float] = field(default_factory=dict)
    first_frame_s: float = math.nan
    """From the launcher's start to the first env frame (status.json `startup`)."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(row, dict) and "time" in row and "env_frames" in row:
            rows.append(row)
    return rows


def read_first_frame_s(run_dir: Path) -> float:
    """Seconds from the launcher's start to the run's first env frame, from status.json
    (NaN when the run did not record it)."""
    value = ((read_status(run_dir) or {}).get("startup") or {}).get("first_frame_s")
    return float(value) if isinstance(value, int | float) else math.nan


def steady_figures(index: int, rows: list[dict[str, Any]]) -> RunResult:
    """Steady fps and time splits: from the first row with env_frames > 0 to the last row."""
    start = next((i for i, row in enumerate(rows) if row["env_frames"] > 0), None)
    if start is None:
        raise BenchError("no env frames were recorded; is --seconds long enough for start-up?")
    first, last = rows[start], rows[-1]
    span = last["time"] - first["time"]
    if span <= 0:
        raise BenchError(f"no steady window after a start-up of {first['time']:.1f}s; "
                         "raise --seconds")
    frames = last["env_frames"] - first["env_frames"]
    steady = rows[start + 1:]
    splits = {}
    for name, key in SPLIT_COLUMNS:
        values = [row[key] for row in steady if isinstance(row.get(key), (int, float))]
        splits[name] = statistics.fmean(values) if values else math.nan
    return RunResult(index, first["time"], span, frames, frames / span, splits)
