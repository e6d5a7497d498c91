"""Metrics rows across worker restarts and resumes, and the TensorBoard copy of them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from srl_jax.dataflow.metrics_table import (
    COMMON,
    CONTRACT_KEYS,
    OTHER_ROWS,
    Aggregate,
    Counter,
    Row,
    Shown,
    recent_return_means,
    row_keys,
)
from srl_jax.dataflow.worker_kinds import KINDS, WorkerKind, metrics_reference_markdown
from srl_jax.runtime.metrics import MetricsAggregator, MetricsWriter, tensorboard_tag
from tests.conftest import read_events

NO_ARRAYS: dict[str, np.ndarray] = {}


def learner(version: int, frames: int, lag_sum: float, lag_count: int) -> dict[str, float]:
    return {"learner_steps": version, "frames_consumed": frames,
            "lag_sum": lag_sum, "lag_count": lag_count, "samples_dropped_stale": 2}


def test_a_restored_learner_neither_resets_rows_nor_spikes_rates() -> None:
    metrics = MetricsAggregator()
    metrics.observe("actor-0", "actor", {"env_frames": 1000}, NO_ARRAYS, first=True)
    metrics.observe("learner-0", "learner", learner(10, 1000, 5.0, 10), NO_ARRAYS, first=True)
    metrics.row(1.0)
    metrics.observe("learner-0", "learner", learner(20, 2000, 10.0, 20), NO_ARRAYS)
    assert metrics.row(2.0)["learner/samples_per_s"] == 1000.0
    metrics.retire("learner-0")  # dies after version 20; its last checkpoint was 15
    while_down = metrics.row(3.0)
    assert while_down["learner_steps"] == 20 and while_down["samples_dropped_stale"] == 2
    assert while_down["learner/samples_per_s"] == 0.0
    metrics.observe("learner-0", "learner", learner(15, 1500, 7.0, 15), NO_ARRAYS, first=True)
    back = metrics.row(4.0)
    assert back["learner_steps"] == 15
    assert back["learner/samples_per_s"] == 0.0 and "policy_lag_mean" not in back
    metrics.observe("learner-0", "learner", learner(16, 1600, 7.0 + 3.0, 15 + 2), NO_ARRAYS)
    after = metrics.row(5.0)
    assert after["learner/samples_per_s"] == 100.0 and after["policy_lag_mean"] == 1.5
    assert after["system/learner_restarts"] == 0  # counted by the controller, not here


def test_a_dead_actor_keeps_its_frames_in_the_totals() -> None:
    metrics = MetricsAggregator()
    metrics.observe("actor-0", "actor", {"env_frames": 700}, NO_ARRAYS, first=True)
    assert metrics.row(1.0)["env_frames"] == 700
    metrics.retire("actor-0")
    metrics.observe("actor-0", "actor", {"env_frames": 50}, NO_ARRAYS, first=True)
    row = metrics.row(2.0)
    assert row["env_frames"] == 750 and row["fps"] == 50.0


def test_a_resumed_run_continues_frames_and_time() -> None:
    metrics = MetricsAggregator(env_frames_base=10_000, time_base=20.0, restarts=2)
    metrics.observe("actor-0", "actor", {"env_frames": 500}, NO_ARRAYS, first=True)
    row = metrics.row(22.0)
    assert row["time"] == 22.0 and row["env_frames"] == 10_500
    assert row["fps"] == 250.0 and row["system/restarts"] == 2


def test_recent_return_means_average_the_last_n_episodes_or_all_while_fewer() -> None:
    assert recent_return_means([]) == {}
    returns = [float(i) for i in range(150)]  # 0 .. 149, oldest first
    assert recent_return_means(returns) == {"episode_return_mean_last20": 139.5,
                                            "episode_return_mean_last100": 99.5}
    assert recent_return_means([10.0, 20.0, 60.0], windows=(2, 5)) == {
        "episode_return_mean_last2": 40.0, "episode_return_mean_last5": 30.0}


def test_rows_carry_rolling_means_over_episodes_not_rows() -> None:
    metrics = MetricsAggregator()

    def episodes(returns: list[float]) -> dict[str, np.ndarray]:
        return {"episode_return": np.array(returns), "episode_length": np.ones(len(returns))}

    assert "episode_return_mean_last20" not in metrics.row(1.0)  # no episode yet
    metrics.observe("actor-0", "actor", {"env_frames": 10}, episodes([0.0] * 90), first=True)
    metrics.observe("actor-1", "actor", {"env_frames": 10}, episodes([100.0] * 5), first=True)
    first = metrics.row(2.0)
    assert first["episode_return_mean_last20"] == 25.0  # 15 zeros, then the 5 hundreds
    assert first["episode_return_mean_last100"] == round(500 / 95, 3)
    metrics.observe("actor-0", "actor", {"env_frames": 20}, episodes([200.0] * 15))
    second = metrics.row(3.0)
    assert second["episode_return_mean"] == 200.0  # this row's episodes alone
    assert second["episode_return_mean_last20"] == 175.0  # 5 x 100 and 15 x 200
    assert second["episode_return_mean_last100"] == 35.0  # 80 zeros of the first row
    quiet = metrics.row(4.0)  # no episode ended: the windows stand, the row mean is absent
    assert "episode_return_mean" not in quiet
    assert quiet["episode_return_mean_last20"] == 175.0


def test_rows_go_to_metrics_jsonl_and_tensorboard(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    rows = [{"time": 1.0, "env_frames": 100, "fps": 100.0, "episode_return_mean": 20.5,
             "actor/time_env_frac": 0.25, "learner/loss": 1.5},
            {"time": 2.0, "env_frames": 300, "fps": 200.0, "actor/time_env_frac": 0.5,
             "learner/loss": 0.5}]
    for row in rows:
        writer.write(row)
    writer.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
    scalars = {(v.tag, e.step): v.simple_value for e in read_events(tmp_path)
               for v in e.summary.value}
    assert scalars == {
        ("train/env_frames", 100): 100, ("train/fps", 100): 100.0,
        ("train/episode_return_mean", 100): 20.5, ("actor/time_env_frac", 100): 0.25,
        ("learner/loss", 100): 1.5, ("train/env_frames", 300): 300, ("train/fps", 300): 200.0,
        ("actor/time_env_frac", 300): 0.5, ("learner/loss", 300): 0.5}
    assert tensorboard_tag("time") is None and tensorboard_tag("system/restarts") == \
        "system/restarts"


def test_the_table_makes_each_row_key_once_and_the_contract_keys_all() -> None:
    keys = [key for kind in KINDS.values() for key in row_keys(kind.counters)]
    keys += row_keys(COMMON) + [row.key for row in OTHER_ROWS]
    assert len(keys) == len(set(keys)), "a row key made twice"
    assert set(CONTRACT_KEYS) <= set(keys)
    for kind in KINDS.values():
        names = {counter.name: counter for counter in kind.counters}
        assert len(names) == len(kind.counters), f"{kind.name}: a counter declared twice"
        overs = [row.over for counter in kind.counters for row in counter.rows if row.over]
        assert set(overs) <= set(names), f"{kind.name}: a ratio over an undeclared counter"


def test_the_metrics_reference_lists_every_kind_counter_and_row() -> None:
    reference = metrics_reference_markdown()
    for kind in KINDS.values():
        assert f"### {kind.name}" in reference
        assert all(f"`{counter.name}`" in reference for counter in kind.counters)
        assert all(f"`{key}`" in reference for key in row_keys(kind.counters))
    assert all(f"`{row.key}`" in reference for row in OTHER_ROWS)


ARCHIVE_COUNTERS = (
    Counter("episodes_archived", "episodes", Aggregate.SUM, "episodes written to the archive",
            (Row("archive/episodes_archived"), Row("archive/episodes_per_s", Shown.RATE))),
    Counter("archive_mb", "MiB", Aggregate.LEVEL, "the archive's size",
            (Row("archive/size_mb", digits=1),)),
)


def test_a_new_kinds_declared_counters_become_rows_once_it_reports() -> None:
    """Declared with its kind, a counter reaches the rows with no change to the aggregator;
    a dead worker's sum stays in the total, its level goes."""
    archive = WorkerKind("archive", "tests.test_metrics:Archive", False, lambda _: 1,
                         "learner", "keeps episodes", counters=ARCHIVE_COUNTERS)
    KINDS["archive"] = archive
    try:
        metrics = MetricsAggregator()
        assert "archive/episodes_archived" not in metrics.row(1.0), "no archive reported yet"
        metrics.observe("archive-0", "archive", {"episodes_archived": 10, "archive_mb": 2.25},
                        NO_ARRAYS, first=True)
        row = metrics.row(3.0)
        assert row["archive/episodes_archived"] == 10 and row["archive/episodes_per_s"] == 5.0
        assert row["archive/size_mb"] == 2.2
        metrics.retire("archive-0")
        metrics.observe("archive-0", "archive", {"episodes_archived": 4}, NO_ARRAYS, first=True)
        row = metrics.row(4.0)
        assert row["archive/episodes_archived"] == 14 and row["archive/size_mb"] == 0
    finally:
        del KINDS["archive"]


def test_an_undeclared_counter_adds_up_as_a_sum_and_is_named_once(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = MetricsAggregator()
    with caplog.at_level(logging.WARNING, logger="metrics"):
        for frames in (10, 20):
            metrics.observe("actor-0", "actor", {"env_frames": frames, "frames_skipped": 1},
                            NO_ARRAYS)
    assert [r.getMessage() for r in caplog.records] == [
        "actor sends the counter 'frames_skipped', which the metrics table does not declare: "
        "it adds up as a sum and makes no row"]
    metrics.retire("actor-0")
    assert metrics.total("actor", "frames_skipped") == 1
    assert not any("frames_skipped" in key for key in metrics.row(1.0))


def test_a_worker_retired_with_a_counter_at_zero_keeps_the_sums_right() -> None:
    """A counter a worker reported only as 0 is in no running sum; retiring the worker
    takes it out all the same."""
    metrics = MetricsAggregator()
    metrics.observe("actor-0", "actor", {"env_frames": 5, "auth_refused": 0}, NO_ARRAYS)
    metrics.observe("actor-1", "actor", {"env_frames": 7, "auth_refused": 0}, NO_ARRAYS)
    metrics.retire("actor-0")
    assert metrics.total("actor", "env_frames") == 12
    assert metrics.total("actor", "auth_refused") == 0
