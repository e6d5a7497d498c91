"""A worker kind and an env family from test files only, in one real run.

The run's experiment names two plugins: tests/disk_watch_plugin.py adds the worker kind
'disk' with its own counters, tests/test_env_family_plugin.py the env family
'countdown:<n>'. Nothing in the package knows either: the disk watcher's counters reach
metrics.jsonl through the metrics table it declares, and the countdown episodes (each
of exactly STEPS steps) through the actors.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, Processes, launch, read_metrics, read_status
from tests.test_env_family_plugin import EXPERIMENT as COUNTDOWN
from tests.test_env_family_plugin import STEPS

PLUGIN = "tests.disk_watch_plugin"
EXPERIMENT = {**COUNTDOWN, "name": "countdown_disk_watch",
              "plugins": [*COUNTDOWN["plugins"], PLUGIN]}


@pytest.mark.slow
def test_a_plugin_kinds_counters_and_a_plugin_familys_episodes_reach_metrics(
        processes: Processes, tmp_path: Path) -> None:
    path = tmp_path / "countdown_disk_watch.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    process, run_dir = launch(processes, tmp_path, experiment=str(path))
    assert process.wait(timeout=300) == 0, (tmp_path / "launch.log").read_text()
    rows = read_metrics(run_dir)
    watched = [row for row in rows if "disk/scans" in row]
    assert watched, "the disk watcher's counters reached no row"
    assert watched[-1]["disk/scans"] >= 1 and "disk/scans_per_s" in watched[-1]
    assert max(row["disk/run_dir_mib"] for row in watched) > 0
    episodes = [row for row in rows if "episode_return_mean" in row]
    assert episodes, "no countdown episode reached metrics.jsonl"
    assert {row["episode_return_mean"] for row in episodes} == {STEPS}
    assert {row["episode_length_mean"] for row in episodes} == {STEPS}
    assert "does not declare" not in (run_dir / "logs" / "controller.log").read_text()
    workers = {w["name"]: w for w in read_status(run_dir)["workers"]}
    assert workers["disk-0"]["kind"] == "disk" and workers["disk-0"]["state"] == "stopped"


def test_the_metrics_reference_documents_a_plugin_kind() -> None:
    """In a process of its own: importing the plugin here would register the kind in
    every other test's registry."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {PLUGIN}; from srl_jax.dataflow.worker_kinds import "
         "metrics_reference_markdown; print(metrics_reference_markdown())"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    assert "### disk" in result.stdout
    assert "| `run_dir_mib` | MiB | level | `disk/run_dir_mib` (as aggregated) |" in result.stdout
