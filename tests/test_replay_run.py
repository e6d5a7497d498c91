"""Ape-X DQN end to end: replay servers as real processes under load, bad input and kills.

One run of `cartpole_dqn` with two replay servers and a small capacity (so they fill
and then overwrite) takes every check in turn: malformed chunks, sample requests and
priority updates sent to a server are counted and dropped while it keeps serving; a
full server's memory stays flat; a killed server is restarted empty and training goes
on from the other shard meanwhile; a killed learner comes back from its checkpoint and
samples the contents that survived; the greedy policy learns within an update budget;
and the checkpoints load as a policy. The time to 475 itself is a benchmark
(python -m bench.peers.compare --cases dqn), not a test.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import zmq

from actors.envs import policy_spec
from policy.export import load_policy
from srl_jax.dataflow.chunk_spec import Layout, run_chunk_layout
from srl_jax.dataflow.stream_table import INSERTS, REPLAY
from srl_jax.runtime.memory import resident_mib
from srl_jax.runtime.run_dir import read_run_config, read_status
from srl_jax.wire.streams import send
from tests.conftest import (
    CARTPOLE_MARGIN,
    CARTPOLE_RANDOM_RETURN,
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
CAPACITY = 8192
"""Per server: full after ~1,000 updates' inserts, so overwriting is exercised, yet
large enough for DQN to learn from (a few seconds of data makes it forget)."""
FAST = ("learner.dqn.learning_rate=0.001", "actors.count=1", "actors.envs=16")
"""Sized for the test, not the benchmark: at 4x the config's step size the greedy policy
passes random play by the margin within ~1,300 updates (at 2.5e-4 it took ~3,000), before
the kills are done; one actor of 16 envs explores with the same epsilon ladder in half the
requests."""
RSS_GROWTH_MB = 16.0
UPDATES = 2500
"""The update budget within which an evaluation must show learning: in 27 runs (13 alone,
14 two at a time on 2 cores) the first evaluation past random play's return by the margin
was of a policy of 750 to 1,500 updates (median 1,000; evaluations come every 250 to 500),
and the kills were done at 1,650 to 2,950; a budget past both keeps the test's time."""


def replay_endpoint(run_dir: Path, key: str) -> str:
    return (run_dir / "names" / key.replace("/", "__")).read_text().strip()


def malformed(push: zmq.Socket, dealer: zmq.Socket, layout: Layout) -> int:
    """Send bad inserts, sample requests and priority updates; how many there were.
    `layout`: the run's chunks, one of which comes well formed but for its priorities."""
    good_names = ("obs", "actions", "logp", "values", "rewards", "terminated", "truncated",
                  "trunc_values", "state", "versions")
    chunks = [
        {name: np.zeros((17, 8), np.float32) for name in good_names},  # wrong shapes
        {"obs": np.zeros((17, 8, 4), np.float32)},  # missing arrays
        {name: np.zeros((3,), np.int8) for name in (*good_names, "extra")},
        {name: np.full(shape, np.nan if name == "priorities" else 0, dtype)
         for name, (shape, dtype) in layout.items()},  # the actor's priorities: NaN
    ]
    for arrays in chunks:
        send(push, "samples", {}, arrays)
    requests = [{"seq": 1, "rows": -1, "window": 3}, {"seq": 1, "rows": 1 << 20, "window": 3},
                {"seq": "x", "rows": 8, "window": 3}, {"rows": 8}]
    for meta in requests:
        send(dealer, "sample_request", meta)
    updates = [
        {"slots": np.array([0, 1]), "generations": np.array([1])},  # missing, mismatched
        {"slots": np.array([0]), "generations": np.array([1]), "priorities": np.array([1])},
        {"slots": np.array([10**9]), "generations": np.array([1]),
         "priorities": np.array([1.0])},
        {"slots": np.array([0]), "generations": np.array([1]),
         "priorities": np.array([np.nan])},
        {"slots": np.zeros((2, 2), np.int64), "generations": np.zeros((2, 2), np.int64),
         "priorities": np.zeros((2, 2))},
    ]
    for arrays in updates:
        send(dealer, "priorities", {}, arrays)
    return len(chunks) + len(requests) + len(updates)


def replay_sizes(run_dir: Path) -> list[float]:
    return [r["replay/size"] for r in read_metrics(run_dir) if "replay/size" in r]


def test_replay_servers_survive_bad_input_kills_and_keep_memory_flat(
        processes: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    process, run_dir = launch(
        processes, tmp_path, "replay.count=2", f"replay.capacity={CAPACITY}",
        "replay.min_size=500", "stop.target_eval_return=null", "stop.wall_time_s=600",
        "checkpoint.every_updates=200", "runtime.restart_backoff_s=0.2",
        *FAST, experiment="cartpole_dqn")
    log = tmp_path / "launch.log"
    wait_for(lambda: all_running(run_dir) or process.poll() is not None, 90, "all running")
    wait_for(lambda: last_row(run_dir).get("learner_steps", 0) >= 50
             or process.poll() is not None, 90, "updates on sampled batches")
    assert process.poll() is None, log.read_text()

    # Bad input to replay server 0: counted and dropped, the server keeps serving.
    base = last_row(run_dir)["system/wire_rejected"]
    context = zmq.Context()
    push, dealer = context.socket(zmq.PUSH), context.socket(zmq.DEALER)
    try:
        for sock in (push, dealer):
            sock.setsockopt(zmq.LINGER, 0)
        push.connect(replay_endpoint(run_dir, INSERTS.key("default", 0)))
        dealer.connect(replay_endpoint(run_dir, REPLAY.key("default", 0)))
        config = read_run_config(run_dir)
        sent = malformed(push, dealer, run_chunk_layout(config, policy_spec(config)))
        wait_for(lambda: last_row(run_dir).get("system/wire_rejected", 0) - base >= sent
                 or process.poll() is not None, 30, f"{sent} rejects counted")
    finally:
        push.close()
        dealer.close()
        context.term()
    assert last_row(run_dir)["system/wire_rejected"] - base == sent

    # Memory: the servers are full (2 x CAPACITY) and overwrite; RSS stays flat.
    wait_for(lambda: last_row(run_dir).get("replay/size", 0) >= 2 * CAPACITY - 64
             or process.poll() is not None, 90, "both servers full")
    status = read_status(run_dir)
    pid = worker(status, "replay-0")["pid"]
    rss_full = resident_mib(pid)
    steps = last_row(run_dir)["learner_steps"]
    wait_for(lambda: last_row(run_dir).get("learner_steps", 0) >= steps + 300
             or process.poll() is not None, 90, "300 more updates on a full buffer")
    assert resident_mib(pid) - rss_full < RSS_GROWTH_MB
    row = last_row(run_dir)
    assert row["replay/memory_mb"] > 0 and row["replay/priority_max"] > 0
    assert 0 <= row["replay/insert_wait_frac"] <= 1 and 0 <= row["replay/sample_wait_frac"] <= 1

    # Kill replay server 1: restarted empty, the learner goes on with server 0 meanwhile.
    victim = worker(read_status(run_dir), "replay-1")["pid"]
    os.kill(victim, signal.SIGKILL)
    steps = last_row(run_dir)["learner_steps"]
    wait_restarted(run_dir, "replay-1", victim, 60)
    wait_for(lambda: last_row(run_dir).get("learner_steps", 0) >= steps + 100
             or process.poll() is not None, 60, "updates after the replay server's kill")

    # Kill the learner: it resumes from its checkpoint and samples what survived.
    victim = worker(read_status(run_dir), "learner-0")["pid"]
    size_before = last_row(run_dir)["replay/size"]
    os.kill(victim, signal.SIGKILL)
    wait_restarted(run_dir, "learner-0", victim, 90)
    resumed_at = len(read_metrics(run_dir))
    wait_for(lambda: any(r.get("learner/samples_per_s", 0) > 0
                         for r in read_metrics(run_dir)[resumed_at:])
             or process.poll() is not None, 90, "the restarted learner's updates")
    assert process.poll() is None, log.read_text()
    sizes = [r["replay/size"] for r in read_metrics(run_dir)[resumed_at:]]
    assert min(sizes) >= min(size_before, CAPACITY), "the replay contents survived the learner"

    # And the greedy policy learned within UPDATES updates: the evaluations up to one of a
    # policy past the budget (the timeout only guards against a hang) include one that
    # beats random play by the margin, 15 standard errors of 5 random episodes' mean. (Not
    # more: with this small buffer and its kills the greedy return can sit at 120-127 for
    # thousands of updates before it climbs on.)
    wait_for(lambda: any(r.get("eval_policy_version", 0) >= UPDATES
                         for r in read_metrics(run_dir)) or process.poll() is not None, 150,
             f"an evaluation of a policy of {UPDATES} updates")
    assert process.poll() is None, log.read_text()
    evaluated = [(r["eval_policy_version"], r["eval_return_mean"])
                 for r in read_metrics(run_dir) if "eval_return_mean" in r]
    interrupt(process, log)
    assert max(mean for _, mean in evaluated) >= CARTPOLE_RANDOM_RETURN + CARTPOLE_MARGIN, (
        f"evaluations (policy version, return): {evaluated}")

    # Its checkpoints (target network included) load as a greedy policy, with no library
    # warnings.
    caplog.clear()
    policy = load_policy(run_dir)
    assert policy.act(np.zeros(4, np.float32)) in (0, 1)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
