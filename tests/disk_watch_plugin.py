"""A worker kind from outside the package: 'disk', which watches the run directory's size.

The whole kind is this module: its worker class, its counters (the rows of
metrics.jsonl they become, srl_jax/dataflow/metrics_table.py) and one `register_kind` call,
run when the module is imported. An experiment names the module in `plugins`, so the
launcher and every worker process import it; nothing in the package is edited.

It is not a test module on purpose: pytest imports every test module in its processes,
and a kind registered there would join the registry every other test reads. Only an
experiment that names this plugin plans a disk worker.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.metrics_table import Aggregate, Counter, Row, Shown
from srl_jax.dataflow.worker_kinds import WorkerKind, register_kind
from srl_jax.runtime.worker_base import Worker

SCAN_EVERY_S = 0.2


def size_mib(root: Path) -> float:
    """The size of the files under `root` (those gone while it looks are skipped)."""
    total = 0
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size if path.is_file() else 0
    return total / 2**20


class DiskWatcher(Worker):
    """Scans the run directory every SCAN_EVERY_S and reports its size."""

    kind = "disk"
    scans = 0
    run_dir_mib = 0.0

    def run_once(self) -> None:
        self.run_dir_mib = size_mib(self.run_dir)
        self.scans += 1
        time.sleep(SCAN_EVERY_S)

    def counters(self) -> dict[str, float]:
        return {"scans": self.scans, "run_dir_mib": self.run_dir_mib}


COUNTERS = (
    Counter("scans", "scans", Aggregate.SUM, "scans of the run directory",
            (Row("disk/scans"), Row("disk/scans_per_s", Shown.RATE))),
    Counter("run_dir_mib", "MiB", Aggregate.LEVEL, "the run directory's size",
            (Row("disk/run_dir_mib", digits=3),)),
)


def _one_if_named(config: ExperimentConfig) -> int:
    """One disk watcher in a run whose experiment names this plugin."""
    return int(__name__ in config.plugins)


register_kind(WorkerKind("disk", f"{__name__}:DiskWatcher", False, _one_if_named, "learner",
                         "watches the run directory's size", progress="scans",
                         counters=COUNTERS))
