"""MuZero end to end: `cartpole_muzero` as real processes, its servers killed mid-run.

One run: the inference server acts by search (its simulations and search depth reach the
metrics), the replay server reanalyses what it samples, and the learner trains. Then the
searching inference server and the reanalysing replay server are killed together: each
is restarted (the replay server empty, following the parameters again), and the run goes
on, reanalysing again. That the config reaches 475 is a benchmark (`python -m bench.configs
cartpole_muzero`), not a test.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from srl_jax.runtime.run_dir import read_status
from tests.conftest import (
    Processes,
    all_running,
    interrupt,
    last_row,
    launch,
    read_metrics,
    wait_for,
    wait_restarted,
    worker,
)

pytestmark = pytest.mark.slow
SIMULATIONS = 8
"""cartpole_muzero's: a search's deepest node is at most this deep."""


def reanalysed_since(run_dir: Path, row: int) -> bool:
    return any(r.get("replay/reanalysed_per_s", 0) > 0 for r in read_metrics(run_dir)[row:])


def test_muzero_searches_reanalyses_and_goes_on_through_killed_servers(
        processes: Processes, tmp_path: Path) -> None:
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              "stop.wall_time_s=600", "runtime.restart_backoff_s=0.2",
                              "replay.min_size=500", experiment="cartpole_muzero")
    log = tmp_path / "launch.log"
    wait_for(lambda: all_running(run_dir) or process.poll() is not None, 120, "all running")
    wait_for(lambda: (reanalysed_since(run_dir, 0) and last_row(run_dir)["learner_steps"] > 0)
             or process.poll() is not None, 120, "reanalysed sequences trained on")
    assert process.poll() is None, log.read_text()
    searching = [r for r in read_metrics(run_dir) if r.get("inference/simulations_per_s")]
    assert searching, "the server counts its simulations"
    assert all(1 <= r["inference/search_depth_mean"] <= SIMULATIONS for r in searching)

    status = read_status(run_dir)
    victims = {name: worker(status, name)["pid"] for name in ("inference-0", "replay-0")}
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    for name, pid in victims.items():
        wait_restarted(run_dir, name, pid, 120)
    steps, restarted_at = last_row(run_dir)["learner_steps"], len(read_metrics(run_dir))
    wait_for(lambda: (last_row(run_dir).get("learner_steps", 0) >= steps + 20
                      and reanalysed_since(run_dir, restarted_at)) or process.poll() is not None,
             120, "updates and reanalysis after the kills")
    assert process.poll() is None, log.read_text()
    assert last_row(run_dir)["system/restarts"] == 2
    interrupt(process, log)
