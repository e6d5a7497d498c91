"""The controller's CPU per heartbeat entry: what it spends on the host agents' `stats_batch`
messages, per whole heartbeat, per sign of life and per message, with nothing else running.

    python -m bench.controller_heartbeats [--hosts 20] [--workers-per-host 100]
        [--seconds 10] [--repeats 3] [--json PATH]

The real parts: the `Controller` (its worker records, metrics and status, its loop turn's
`_take_heartbeats` from its stats socket), the host agent's `Coalescer` and `batches`, the
wire codec. `--hosts` hosts of `--workers-per-host` actors heartbeat every
`runtime.stats_interval_s` over `--seconds` of made-up time, each beat as a real actor's
(`heartbeat_meta` with the actor's counters from the metrics table, an episode's arrays
every fourth beat, `waiting` an inference reply whose `since` moves every beat: the
oldest pending request). Each host's beats go through its coalescer and are batched every
`host_agent.BATCH_S`, encoded; the messages wait on an inproc socket (no CURVE: that cost
is ZMQ's I/O thread's, per message), and the controller takes them all. The figure is
this process's CPU time over the take, divided by what it took; the best of `--repeats`.

Scenarios (rows):
- `real`: the mix the agent makes of real heartbeats (what swarm runs see);
- `whole`: every heartbeat whole (a coalescer that never holds one back): per whole one;
- `signs`: after a first whole heartbeat each (not timed), signs of life only: per sign;
- `messages`: one worker per host, signs only: per message with a single entry.

Results go to `bench/results/controller_heartbeats.json` (`--json PATH` elsewhere), with
the commit and the machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from bench.harness.machine import git_commit, write_results
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.metrics_table import COMMON
from srl_jax.dataflow.stream_table import STATS
from srl_jax.dataflow.worker_kinds import worker_kind
from srl_jax.runtime.backends import LocalBackend, WorkerHandle
from srl_jax.runtime.controller import Controller
from srl_jax.runtime.hosts.host_agent import BATCH_S, Coalescer, batches, sign_of_life
from srl_jax.runtime.worker_base import heartbeat_meta
from srl_jax.wire.codec import encode
from srl_jax.wire.streams import make_socket

FIRST_PID = 1 << 22
"""Made-up pids, above any real one."""
REPLY = "an inference reply of policy 'default'"
"""What an actor waits on, as actors/actor_worker.py says it."""
TIME_COUNTERS = ("time_env", "time_wait", "time_send")


@dataclass
class Scenario:
    name: str
    hosts: int
    per_host: int
    full_every_s: float | None
    """The coalescer's (None: the agent's own)."""
    warm: bool = False
    """Whether each worker's first whole heartbeat is taken before the timed part."""


@dataclass
class Traffic:
    """A scenario's messages, as the controller's socket receives them."""

    warm: list[list[bytes]]
    timed: list[list[bytes]]
    whole: int
    signs: int


def actor_counters(beat: int) -> dict[str, float]:
    """An actor's counters after `beat` heartbeats (names from the metrics table)."""
    names = [c.name for c in (*worker_kind("actor").counters, *COMMON) if not c.family]
    return {name: beat * 0.5 if name in TIME_COUNTERS else beat * 64 for name in names}


def traffic(scenario: Scenario, seconds: float, period_s: float, wall: float) -> Traffic:
    """The scenario's `stats_batch` messages: each host's beats through its coalescer,
    batched every BATCH_S; an actor's beats are spread over its period."""
    warm: list[list[bytes]] = []
    timed: list[list[bytes]] = []
    whole = signs = 0
    ticks = int(seconds / BATCH_S)
    for host in range(scenario.hosts):
        coalescer = Coalescer() if scenario.full_every_s is None else \
            Coalescer(scenario.full_every_s)
        first = host * scenario.per_host
        workers = range(first, first + scenario.per_host)
        beats_of = {w: 0 for w in workers}
        for tick in range(ticks + 1):
            now = tick * BATCH_S
            beats, alive = [], []
            for w in workers:
                offset = (w % 97) / 97 * period_s
                while offset + beats_of[w] * period_s <= now:
                    beats_of[w] += 1
                    meta = heartbeat_meta(
                        f"actor-{w}", "actor", w, "default", "running",
                        actor_counters(beats_of[w]), [],
                        (REPLY, wall + offset + beats_of[w] * period_s - 0.003),
                        pid=FIRST_PID + w)
                    arrays = {"episode_return": np.array([21.0], np.float32),
                              "episode_length": np.array([21], np.int32)} \
                        if beats_of[w] % 4 == 0 else {}
                    if (sent := coalescer.take(meta, arrays, now)) is not None:
                        beats.append(sent)
                    else:
                        alive.append(sign_of_life(meta))
            frames = [list(encode("stats_batch", meta, arrays))
                      for meta, arrays in batches(beats, alive)]
            if scenario.warm and now <= period_s:  # each worker's first heartbeat
                warm += frames
                continue
            timed += frames
            whole, signs = whole + len(beats), signs + len(alive)
    return Traffic(warm, timed, whole, signs)


def controller_for(workers: int, run_dir: Path) -> Controller:
    """The real controller of `workers` actors (and the default run's other workers),
    every record with a process, not running its loop: the bench feeds its socket."""
    config = ExperimentConfig()
    config.actors.count = workers
    controller = Controller(config, run_dir, LocalBackend(run_dir, shared_memory=False))
    for record in controller.workers:
        record.handle = WorkerHandle(record.kind, record.index, FIRST_PID + record.index,
                                     "here", None, record.policy)
    return controller


def taken(controller: Controller, sender: zmq.Socket, messages: list[list[bytes]]) -> float:
    """CPU seconds the controller's loop turns spend taking `messages`."""
    for frames in messages:
        sender.send_multipart(frames, copy=False)
    started = time.process_time()
    while controller.stats.poll(0):
        controller._take_heartbeats()
    return time.process_time() - started


def measure(scenario: Scenario, seconds: float, repeats: int) -> dict[str, Any]:
    context = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="srl_jax-controller-heartbeats-") as workdir:
        controller = controller_for(scenario.hosts * scenario.per_host, Path(workdir))
        period_s = controller.config.runtime.stats_interval_s
        made = traffic(scenario, seconds, period_s, time.time())
        controller.stats = make_socket(context, STATS.bind_type, hwm=0)
        address = f"inproc://controller-heartbeats-{scenario.name}"
        controller.stats.bind(address)
        sender = make_socket(context, STATS.connect_type, hwm=0)
        sender.connect(address)
        try:
            cpu_s = []
            for _ in range(repeats):
                taken(controller, sender, made.warm)
                cpu_s.append(taken(controller, sender, made.timed))
        finally:
            sender.close(linger=0)
            controller.stats.close(linger=0)
            context.term()
    best = min(cpu_s)
    entries = made.whole + made.signs

    def per(count: int) -> float | None:
        return round(best / count * 1e6, 2) if count else None

    return {"hosts": scenario.hosts, "workers_per_host": scenario.per_host,
            "messages": len(made.timed), "whole_heartbeats": made.whole,
            "signs_of_life": made.signs, "whole_fraction": round(made.whole / entries, 3),
            "cpu_s": round(best, 4), "us_per_message": per(len(made.timed)),
            "us_per_entry": per(entries), "us_per_whole": per(made.whole) if not made.signs
            else None, "us_per_sign": per(made.signs) if not made.whole else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--workers-per-host", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="made-up heartbeat time per scenario")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default bench/results/controller_heartbeats.json)")
    args = parser.parse_args()
    hosts, per_host = args.hosts, args.workers_per_host
    scenarios = [Scenario("real", hosts, per_host, None),
                 Scenario("whole", hosts, per_host, 0.0),
                 Scenario("signs", hosts, per_host, float("inf"), warm=True),
                 Scenario("messages", hosts * per_host, 1, float("inf"), warm=True)]
    rows = {}
    print(f"{'scenario':10} {'messages':>9} {'whole':>8} {'signs':>8} {'cpu_s':>7} "
          f"{'us/msg':>8} {'us/entry':>9} {'us/whole':>9} {'us/sign':>8}")
    for scenario in scenarios:
        row = rows[scenario.name] = measure(scenario, args.seconds, args.repeats)
        print(f"{scenario.name:10} {row['messages']:9d} {row['whole_heartbeats']:8d} "
              f"{row['signs_of_life']:8d} {row['cpu_s']:7.3f} {row['us_per_message']:8.1f} "
              f"{row['us_per_entry']:9.2f} {row['us_per_whole'] or '-':>9} "
              f"{row['us_per_sign'] or '-':>8}")
    results = {"hosts": hosts, "workers_per_host": per_host, "seconds": args.seconds,
               "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps({"commit": git_commit(), **results}, indent=2) + "\n")
        print(f"results: {args.json}")
    else:
        print(f"results: {write_results('controller_heartbeats', results)}")


if __name__ == "__main__":
    main()
