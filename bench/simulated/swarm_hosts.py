"""Simulated hosts for `bench/swarm.py`: real host agents and many simulated workers per
process, each worker with its own sockets and the real messages at the real rates.

A simulated worker does what a worker does towards the control plane, and nothing
else: at its start it asks its host agent for the run's config, looks up the stats and
logs streams, registers the keys its kind binds (a socket bound on loopback, which only
a host agent's parameter relays dial)
and looks up the keys its kind follows, waiting (heartbeating in its setup phase) for
those not registered yet; then, every `runtime.stats_interval_s`, it follows its keys
(`NameService.moved`) and sends a heartbeat with its kind's counters and, for an actor,
an episode's return now and then. It writes a few log lines at its start and one every
LOG_EVERY_S. Every PROBE_EVERY_S it times a `get` of one of its keys at its agent: the
lookup latency the benchmark reports.

The controller's `SwarmBackend` (bench/simulated/swarm_controller.py) starts and signals the
simulated workers: commands come on a PULL socket (msgpack),
exits go back on a PUSH. Run by that backend:
`python -m bench.simulated.swarm_hosts --names E --commands E --events E --hosts 0,1,.. --out F`.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from srl_jax.dataflow.stream_table import INFERENCE, LOGS, PARAMS, SAMPLES, STATS, stream_of
from srl_jax.dataflow.worker_kinds import KINDS
from srl_jax.runtime.hosts.host_agent import HostAgent, agent_address
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.worker_base import heartbeat_meta
from srl_jax.wire.streams import NOBLOCK, make_socket, send

HEARTBEAT_S = 0.5
LOG_EVERY_S = 30.0
PROBE_EVERY_S = 10.0
TICK_S = 0.01
SOCKETS_PER_WORKER = 4
STARTS_PER_TURN = 20
"""Commands taken per turn, so that workers started earlier heartbeat meanwhile."""


def binds(kind: str, index: int) -> list[str]:
    """The keys a worker of `kind` registers (a single policy's run)."""
    if kind == "learner":
        return [SAMPLES.key(index=index), *([PARAMS.key()] if index == 0 else [])]
    if kind == "inference":
        return [INFERENCE.key(index=index)]
    return []


def follows(kind: str, index: int, servers: int, learners: int) -> list[str]:
    """The keys a worker of `kind` follows: an actor every server and learner process,
    a server the parameters."""
    if kind == "actor":
        return [INFERENCE.key(index=i) for i in range(servers)] + \
            [SAMPLES.key(index=i) for i in range(learners)]
    if kind == "inference":
        return [PARAMS.key()]
    return []


class SimWorker:
    """One simulated worker's control-plane traffic."""

    def __init__(self, context: zmq.Context, agent: HostAgent, command: dict[str, Any],
                 servers: int, learners: int, heartbeats_in_process: bool) -> None:
        """`heartbeats_in_process`: hand heartbeats to the agent in this process
        (`HostAgent.offer`) rather than send them on a socket of its own."""
        self.name, self.kind, self.index = command["worker"], command["kind"], command["index"]
        self.policy, self.pid = command["policy"], command["pid"]
        self.context = context
        self.names = NetworkNameService(context, agent.endpoint, None)
        self.agent = agent if heartbeats_in_process else None
        self.stats: zmq.Socket | None = None
        self.logs: zmq.Socket | None = None
        self.phase = "setup"
        self.todo = follows(self.kind, self.index, servers, learners)
        self.followed: dict[str, str] = {}
        now = time.monotonic()
        self.next_beat = now + random.uniform(0, HEARTBEAT_S)
        self.next_log = now + random.uniform(0, LOG_EVERY_S)
        self.next_probe = now + random.uniform(0, PROBE_EVERY_S)
        self.beats = 0
        self.counters = [c.name for c in KINDS[self.kind].counters if not c.name.endswith("/")]
        self.names.run_config()
        self.stats = None if self.agent else self._push(STATS.key(), 64)
        self.logs = self._push(LOGS.key(), 256)
        self.bound = [self._bind(key) for key in binds(self.kind, self.index)]
        self._log(f"{self.name} started (simulated)\n")
        if not self.todo:
            self.phase = "running"

    def _bind(self, key: str) -> zmq.Socket:
        """A real socket on loopback for a key this worker binds: a host agent's relays
        dial the learner's parameters, and nothing here dials any other address."""
        socket = make_socket(self.context, stream_of(key).bind_type)
        port = socket.bind_to_random_port("tcp://127.0.0.1")
        self.names.register(key, f"tcp://127.0.0.1:{port}")
        return socket

    def _push(self, key: str, hwm: int) -> zmq.Socket:
        socket = make_socket(self.context, zmq.PUSH, hwm=hwm)
        socket.connect(self.names.lookup(key, 60.0))
        return socket

    def _log(self, text: str) -> None:
        with contextlib.suppress(zmq.Again):
            send(self.logs, "log", {"worker": self.name, "pid": self.pid},
                 {"text": np.frombuffer(text.encode(), np.uint8)}, flags=NOBLOCK)

    def turn(self, now: float, probes: list[float]) -> float:
        """What is due: setup's lookups, a heartbeat, a log line, a probe; returns when
        the next thing is due."""
        if self.todo and now >= self.next_beat:  # as a worker's lookups wait: one ask a beat
            found = self.names.table(self.todo)
            self.followed.update(found)
            self.todo = [key for key in self.todo if key not in found]
            if not self.todo:
                self.phase = "running"
                self._log(f"{self.name} running\n")
        if now >= self.next_beat:
            self.next_beat += HEARTBEAT_S
            if self.followed:
                self.followed.update(self.names.moved(self.followed))
            self._heartbeat()
        if now >= self.next_log:
            self.next_log += LOG_EVERY_S
            self._log(f"{self.name} still going after {self.beats} heartbeats\n")
        if now >= self.next_probe:
            self.next_probe += PROBE_EVERY_S
            if self.phase != "running":
                return min(self.next_beat, self.next_log, self.next_probe)
            key = next(iter(self.followed), STATS.key())
            started = time.perf_counter()
            self.names.get(key)
            probes.append(time.perf_counter() - started)
        return min(self.next_beat, self.next_log, self.next_probe)

    def _heartbeat(self) -> None:
        self.beats += 1
        counters = {name: self.beats * (i + 1) for i, name in enumerate(self.counters)}
        arrays = {}
        if self.kind == "actor" and self.beats % 4 == 0:
            arrays = {"episode_return": np.array([float(self.beats)], np.float32),
                      "episode_length": np.array([200], np.int32)}
        meta = heartbeat_meta(self.name, self.kind, self.index, self.policy, self.phase,
                              {"wire_rejected": 0, "auth_refused": 0, **counters}, [], None,
                              pid=self.pid)
        if self.agent is not None:
            self.agent.offer(meta, arrays)
            return
        with contextlib.suppress(zmq.Again):
            send(self.stats, "stats", meta, arrays, flags=NOBLOCK)

    def close(self) -> None:
        for socket in (self.stats, self.logs, *self.bound):
            if socket is not None:
                socket.close(linger=0)
        self.names.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", required=True, help="the controller's name service")
    parser.add_argument("--commands", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--hosts", required=True, help="the host indices simulated here")
    parser.add_argument("--run", required=True, help="a token that names this run's agents")
    parser.add_argument("--servers", type=int, required=True)
    parser.add_argument("--learners", type=int, required=True)
    parser.add_argument("--sockets", type=int, required=True,
                        help="sockets this process may open (workers x SOCKETS_PER_WORKER)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulate", choices=("workers", "agents"), default="workers")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, args.sockets + 256)
    hosts = [int(h) for h in args.hosts.split(",")]
    commands = context.socket(zmq.PULL)
    commands.connect(args.commands)
    events = context.socket(zmq.PUSH)
    events.connect(args.events)
    agents = {host: HostAgent(context, args.names, None, agent_address(args.run, f"h{host}"))
              for host in hosts}
    workers: dict[int, SimWorker] = {}
    due: list[tuple[float, int]] = []
    """(when, pid) of each worker's next turn, a heap: a turn visits only those due."""
    probes: list[float] = []
    late = 0
    parent = os.getppid()
    while not stopping and os.getppid() == parent:  # a controller gone leaves none behind
        for _ in range(STARTS_PER_TURN):
            if not commands.poll(0):
                break
            command = msgpack.unpackb(commands.recv())
            if command["op"] == "start":
                agent = agents[command["host"]]
                worker = SimWorker(context, agent, command, args.servers, args.learners,
                                   args.simulate == "agents")
                workers[command["pid"]] = worker
                heapq.heappush(due, (worker.next_beat, command["pid"]))
            elif (worker := workers.pop(command["pid"], None)) is not None:
                worker.close()
                code = 0 if command["signal"] == signal.SIGTERM else -command["signal"]
                events.send(msgpack.packb({"pid": command["pid"], "code": code}))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, pid = heapq.heappop(due)
            if (worker := workers.get(pid)) is None:
                continue  # stopped
            late += now - worker.next_beat > HEARTBEAT_S
            heapq.heappush(due, (worker.turn(now, probes), pid))
        time.sleep(TICK_S)  # a turn every 10 ms: waking for each worker's own time costs more
    for worker in workers.values():
        worker.close()
    for agent in agents.values():
        agent.close()
    args.out.write_text(json.dumps({"probes_s": probes, "late_beats": late}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
