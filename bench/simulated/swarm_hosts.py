"""Simulated hosts for `bench/swarm.py`: real host agents and many simulated workers per
process, each worker with its own sockets and the real messages at the real rates.

A simulated worker does what a worker does towards the control plane, and nothing
else: at its start it asks its host agent for the run's config (its heartbeat period is
the config's `runtime.stats_interval_s`), looks up the stats and logs streams, registers
the keys its kind binds (a socket bound on loopback, which only a host agent's parameter
relays dial) and looks up the keys its kind follows, waiting (heartbeating in its setup
phase) for those not registered yet; then it follows its keys (`NameService.moved`,
every FOLLOW_EVERY_S: a real worker asks at each heartbeat, but its asks end at its
host agent, and the changes and sweeps that reach it come as often either way) and,
every period, sends a heartbeat made as a real worker of its kind makes it:
`heartbeat_meta` with the kind's counters (the metrics table's names, rising), the ports
it bound (`Transport.port_list()`'s format) and what it waits on, from the functions the
real workers' `waiting` calls (an actor's oldest request, sent a moment ago, a server's
and a learner's last batch: a time that moves every beat). An actor sends an episode's
return now and then. It writes a few log lines at its start and one every LOG_EVERY_S.
The lookup latency the benchmark reports: PROBES_PER_S times a second, a running worker
picked at random times a `get` of one of its keys at its agent (a sample, where a probe
of every worker would cost the simulator more than its workers' lookups do). Where the
run has CURVE keys (`SRL_JAX_CURVE_KEYS` in this process's environment, as a cluster's
agents and workers get them), every socket uses them: the agents' upstream, the workers'
sockets to their agent and the sockets they bind.

Cheap enough that the controller's figures are the controller's: each worker's
heartbeat is built once (`heartbeat_meta`) and each beat copies it with what changes
(its counters, one dict per kind a turn that the turn's beats share, and what it waits
on); turns visit only the workers due (a heap), every TICK_S; lookups are timed on a
sample; many hosts share a process, whose simulated workers share a ZMQ context, and
each agent has one of its own (as in a process of its own).

What it measures of itself, written to `--out` every REPORT_EVERY_S and as it stops:
beats due and beats sent more than a period late (or not at all), the main thread's CPU
time (the simulated workers, without the agents' threads), and what the churn did.

Churn, while the bench's window file (`--window`) exists: `--churn F` kills a fraction F
of the actors and inference servers per minute, each stopping dead as at SIGKILL (no
more beats; the backend reports exit code -9, as a killed process's would be), and the
first host process closes one of its host agents every AGENT_RESTART_EVERY_S and starts
it again after AGENT_OUTAGE_S (the workers' heartbeats wait meanwhile, as in their
sockets' queues). A signal from the controller to a live worker is counted: none but
the stop's SIGTERM should come (`killed_alive`).

The controller's `SwarmBackend` (bench/simulated/swarm_controller.py) starts and signals the
simulated workers: commands come on a PULL socket (msgpack), exits go back on a PUSH.
SIGTERM or SIGINT stops the process at its next turn. Run by that backend:
`python -m bench.simulated.swarm_hosts --names E --commands E --events E --hosts 0,1,.. --out F`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import json
import logging
import math
import os
import random
import resource
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import yaml
import zmq

from actors.actor_worker import awaiting_reply
from learners.intake.sample_intake import samples_waited_on
from learners.learner_worker import awaiting_intake
from policy.inference_server import awaiting_requests
from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.stream_table import INFERENCE, LOGS, PARAMS, SAMPLES, STATS, stream_of
from srl_jax.dataflow.worker_kinds import KINDS
from srl_jax.runtime.hosts.host_agent import Beat, HostAgent, agent_address
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.worker_base import heartbeat_meta
from srl_jax.wire.streams import NOBLOCK, make_socket, send
from srl_jax.wire.transport import CurveKeys, Port, curve_connect, keys_from_env

log = logging.getLogger("swarm_hosts")

WINDOW_FILE = "window"
"""In the run directory while the bench measures: churn and lookup probes run then."""
LOG_EVERY_S = 30.0
PROBES_PER_S = 20.0
FOLLOW_EVERY_S = 5.0
TICK_S = 0.05
REPORT_EVERY_S = 1.0
SOCKETS_PER_WORKER = 5
"""A worker's sockets: names, their changes, logs, stats, and a bound one."""
STARTS_PER_TURN = 20
"""Commands taken per turn, so that workers started earlier heartbeat meanwhile."""
CHURN_KINDS = ("actor", "inference")
"""The kinds churn kills: a learner of a run without checkpoints is not restarted."""
AGENT_RESTART_EVERY_S = 180.0
FIRST_AGENT_RESTART_S = 15.0
"""Into the window: the first agent restart, then one every AGENT_RESTART_EVERY_S."""
AGENT_OUTAGE_S = 3.0
"""How long a restarted agent is down: well under the default heartbeat timeout (60 s)."""


@functools.lru_cache(maxsize=4)
def heartbeat_period(config_yaml: str) -> float:
    """`runtime.stats_interval_s` of the run's config, as its name service sends it."""
    return float(yaml.safe_load(config_yaml)["runtime"]["stats_interval_s"])


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


def waiting(kind: str, index: int, now_wall: float) -> tuple[str, float] | None:
    """What a running worker of `kind` says it waits on, as the real one says it: its
    oldest request or its last batch, a few milliseconds ago."""
    since = now_wall - random.uniform(0.0, 0.005)
    if kind == "actor":
        return awaiting_reply(DEFAULT_POLICY, since)
    if kind == "inference":
        return awaiting_requests(since)
    if kind == "learner":
        return awaiting_intake(samples_waited_on(SAMPLES.key(index=index), random.randrange(4)),
                               since)
    return None


EPISODE = {"episode_return": np.array([100.0], np.float32),
           "episode_length": np.array([200], np.int32)}
"""An actor's episode, sent with every fourth heartbeat (never changed: beats share it)."""


class Counters:
    """Each kind's counters (the metrics table's names), rising with time; one dict per
    kind a turn, which every beat of the turn shares (none changes it)."""

    def __init__(self) -> None:
        self._steps = {kind: [(c.name, i + 1) for i, c in enumerate(spec.counters)
                              if not c.name.endswith("/")] for kind, spec in KINDS.items()}
        self._now: dict[str, dict[str, float]] = {}
        self._turn = 0

    def advance(self) -> None:
        self._turn += 1
        self._now = {}

    def of(self, kind: str) -> dict[str, float]:
        if (counters := self._now.get(kind)) is None:
            turn = self._turn
            counters = self._now[kind] = {"wire_rejected": 0, "auth_refused": 0, **{
                name: turn * step for name, step in self._steps[kind]}}
        return counters


class SimHost:
    """One simulated host: its agent in a ZMQ context of its own (as in a process of its
    own: a restart ends all its sockets and its ZAP handler), down while it restarts, and
    the heartbeats held meanwhile. Its workers' sockets are in `context`, which the
    process's hosts share (no ZAP handler: only relays dial a worker's bound socket)."""

    def __init__(self, index: int, names: str, run: str, keys: CurveKeys | None,
                 context: zmq.Context) -> None:
        self.index, self._names, self._run, self.keys = index, names, run, keys
        self.context = context
        self.agent: HostAgent | None = None
        self._agent_context: zmq.Context | None = None
        self.held: list[Beat] = []
        self._coming: list[tuple[HostAgent, zmq.Context]] = []
        self._closing: threading.Thread | None = None
        self._start_agent()
        self.ready()

    def _start_agent(self) -> None:
        context = zmq.Context()
        try:
            agent = HostAgent(context, self._names, self.keys,
                              agent_address(self._run, f"h{self.index}"), index=self.index)
        except BaseException:
            context.destroy(linger=0)
            raise
        self._coming.append((agent, context))

    def offer(self, beat: Beat) -> None:
        if self.agent is not None:
            self.agent.offer(*beat)
        else:
            self.held.append(beat)

    def take_down(self) -> None:
        """Close the agent and its context (off the main thread: its threads take a batch
        to end), as a killed agent process goes; `bring_up` starts it again."""
        agent, context = self.agent, self._agent_context
        if agent is None or context is None:
            return
        self.agent = self._agent_context = None

        def close() -> None:
            agent.close()
            context.destroy(linger=0)
        self._closing = threading.Thread(target=close, name=f"agent-h{self.index}-close",
                                         daemon=True)
        self._closing.start()

    def bring_up(self) -> None:
        """Start the agent again off the main thread, once the old one is gone (it asks
        the controller for its config and names); `ready` says when it serves."""
        def start() -> None:
            if self._closing is not None:
                self._closing.join()
            try:
                self._start_agent()
            except Exception:  # its workers go silent: the controller's kills count them
                log.exception("host h%d: its agent did not start again", self.index)
        threading.Thread(target=start, name=f"agent-h{self.index}-start", daemon=True).start()

    def ready(self) -> bool:
        """Whether the agent serves; on its return, the held heartbeats go to it."""
        if self.agent is None and self._coming:
            self.agent, self._agent_context = self._coming.pop()
            for beat in self.held:
                self.agent.offer(*beat)
            self.held = []
        return self.agent is not None

    def close(self) -> None:
        if self._closing is not None:
            self._closing.join(timeout=10)
        if self.agent is not None and self._agent_context is not None:
            self.agent.close()
            self._agent_context.destroy(linger=0)


class SimWorker:
    """One simulated worker's control-plane traffic."""

    def __init__(self, host: SimHost, command: dict[str, Any], servers: int, learners: int,
                 counters: Counters, heartbeats_in_process: bool) -> None:
        """`heartbeats_in_process`: hand heartbeats to the agent in this process
        (`HostAgent.offer`) rather than send them on a socket of its own."""
        assert host.agent is not None
        self.name, self.kind, self.index = command["worker"], command["kind"], command["index"]
        self.policy, self.pid = command["policy"], command["pid"]
        self.host, self.counters = host, counters
        self.keys = host.keys
        self.names = NetworkNameService(host.context, host.agent.endpoint, self.keys)
        self.period = heartbeat_period(self.names.run_config())
        self.phase = "setup"
        self.todo = follows(self.kind, self.index, servers, learners)
        self.followed: dict[str, str] = {}
        now = time.monotonic()
        self.next_beat = now + random.uniform(0, self.period)
        self.next_log = now + random.uniform(0, LOG_EVERY_S)
        self.next_follow = now + random.uniform(0, FOLLOW_EVERY_S)
        self.beats = 0
        self.stats = None if heartbeats_in_process else self._push(STATS.key(), 64)
        self.logs = self._push(LOGS.key(), 256)
        ports: list[Port] = []
        self.bound = [self._bind(key, ports) for key in binds(self.kind, self.index)]
        self.meta = heartbeat_meta(self.name, self.kind, self.index, self.policy, self.phase,
                                   {}, [asdict(port) for port in ports], None, pid=self.pid)
        """The heartbeat, built once: each beat copies it with what changed."""
        self._log(f"{self.name} started (simulated)\n")
        if not self.todo:
            self.phase = "running"

    def _bind(self, key: str, ports: list[Port]) -> zmq.Socket:
        """A real socket on loopback for a key this worker binds (a CURVE server where the
        run has keys): a host agent's relays dial the learner's parameters, and nothing
        here dials any other address."""
        socket = make_socket(self.host.context, stream_of(key).bind_type)
        if self.keys is not None:
            socket.curve_server = True
            socket.curve_secretkey = self.keys.server_secret.encode()
        port = socket.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        self.names.register(key, endpoint)
        ports.append(Port(key, endpoint, f"127.0.0.1:{port}", self.keys is not None))
        return socket

    def _push(self, key: str, hwm: int) -> zmq.Socket:
        socket = make_socket(self.host.context, zmq.PUSH, hwm=hwm)
        curve_connect(socket, self.names.lookup(key, 60.0), self.keys)
        return socket

    def _log(self, text: str) -> None:
        with contextlib.suppress(zmq.Again):
            send(self.logs, "log", {"worker": self.name, "pid": self.pid},
                 {"text": np.frombuffer(text.encode(), np.uint8)}, flags=NOBLOCK)

    def turn(self, now: float) -> float:
        """What is due: setup's lookups, a heartbeat, a log line; returns when the next
        thing is due."""
        agent_up = self.host.agent is not None
        if self.todo and agent_up and now >= self.next_beat:  # one ask a beat, as a
            found = self.names.table(self.todo)               # worker's lookups wait
            self.followed.update(found)
            self.todo = [key for key in self.todo if key not in found]
            if not self.todo:
                self.phase = "running"
                self._log(f"{self.name} running\n")
        if now >= self.next_beat:
            self.next_beat += self.period
            self._heartbeat()
        if now >= self.next_follow:
            self.next_follow += FOLLOW_EVERY_S
            if self.followed:
                self.followed.update(self.names.moved(self.followed))
        if now >= self.next_log:
            self.next_log += LOG_EVERY_S
            self._log(f"{self.name} still going after {self.beats} heartbeats\n")
        return min(self.next_beat, self.next_log, self.next_follow)

    def probe(self) -> float:
        """Seconds a `get` of one of its keys takes at its agent."""
        key = next(iter(self.followed), STATS.key())
        started = time.perf_counter()
        self.names.get(key)
        return time.perf_counter() - started

    def _heartbeat(self) -> None:
        self.beats += 1
        what = waiting(self.kind, self.index, time.time()) if self.phase == "running" else None
        meta = {**self.meta, "phase": self.phase, "counters": self.counters.of(self.kind),
                "waiting": list(what) if what else None}
        arrays = EPISODE if self.kind == "actor" and self.beats % 4 == 0 else {}
        if self.stats is None:  # heartbeats in process
            self.host.offer((meta, arrays))
            return
        with contextlib.suppress(zmq.Again):
            send(self.stats, "stats", meta, arrays, flags=NOBLOCK)

    def close(self) -> None:
        for socket in (self.stats, self.logs, *self.bound):
            if socket is not None:
                socket.close(linger=0)
        self.names.close()


class Stopped(Exception):
    """SIGTERM or SIGINT: stop at once (the bench or the controller stops the swarm)."""


def on_stop_signal(signum: int, _frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


class Swarm:
    """One host process's hosts and workers, their turns, the churn and the figures."""

    def __init__(self, args: argparse.Namespace, keys: CurveKeys | None) -> None:
        self.args = args
        self.in_process = args.simulate == "agents"
        self.workers_context = zmq.Context()
        self.workers_context.set(zmq.MAX_SOCKETS, args.sockets + 256)
        self.hosts = {h: SimHost(h, args.names, args.run, keys, self.workers_context)
                      for h in map(int, args.hosts.split(","))}
        self.context = zmq.Context()
        self.commands = self.context.socket(zmq.PULL)
        self.commands.connect(args.commands)
        self.events = self.context.socket(zmq.PUSH)
        self.events.connect(args.events)
        self.workers: dict[int, SimWorker] = {}
        self.waiting_starts: list[dict[str, Any]] = []
        """Start commands for hosts whose agent is down: the worker waits for it."""
        self.due: list[tuple[float, int]] = []
        """(when, pid) of each worker's next turn, a heap: a turn visits only those due."""
        self.probes: list[float] = []
        self.counters = Counters()
        self._probes_owed = 0.0
        self.figures: dict[str, Any] = {
            "due": 0, "late": 0, "beats": 0, "workers_cpu_s": 0.0, "kills": [],
            "agent_restarts": [], "killed_alive": [], "terminated_alive": 0}
        self.window = False
        self._churn_owed = 0.0
        self._next_report = self._churned_at = time.monotonic()
        self._next_agent_restart = math.inf
        self._down: tuple[SimHost, float] | None = None

    def run(self) -> None:
        parent = os.getppid()
        while os.getppid() == parent:  # a controller gone leaves none behind
            self._take_commands()
            now = time.monotonic()
            started = time.thread_time()
            self._turns(now)
            self.figures["workers_cpu_s"] += time.thread_time() - started
            if now >= self._next_report:
                self._next_report = now + REPORT_EVERY_S
                self._check_window(now)
                self.write()
            if self.window:
                self._churn(now)
            self._restart_agents(now)
            time.sleep(TICK_S)  # a turn every 50 ms: each wake-up costs more than the turn

    def _take_commands(self) -> None:
        for host in self.hosts.values():
            host.ready()
        starts, self.waiting_starts = self.waiting_starts, []
        for command in starts:
            self._start(command)
        for _ in range(STARTS_PER_TURN):
            if not self.commands.poll(0):
                break
            command = msgpack.unpackb(self.commands.recv())
            if command["op"] == "start":
                self._start(command)
                continue
            worker = self.workers.pop(command["pid"], None)
            if worker is None:
                waited = [c for c in self.waiting_starts if c["pid"] == command["pid"]]
                if not waited:
                    continue  # churned already: its exit went with its kill
                self.waiting_starts.remove(waited[0])
            else:
                worker.close()
            if command["signal"] == signal.SIGTERM:
                self.figures["terminated_alive"] += 1
            else:
                self.figures["killed_alive"].append({"pid": command["pid"],
                                                     "signal": command["signal"]})
            code = 0 if command["signal"] == signal.SIGTERM else -command["signal"]
            self.events.send(msgpack.packb({"pid": command["pid"], "code": code}))

    def _start(self, command: dict[str, Any]) -> None:
        host = self.hosts[command["host"]]
        if host.agent is None:
            self.waiting_starts.append(command)
            return
        worker = SimWorker(host, command, self.args.servers, self.args.learners, self.counters,
                           self.in_process)
        self.workers[worker.pid] = worker
        heapq.heappush(self.due, (worker.next_beat, worker.pid))

    def _turns(self, now: float) -> None:
        """Every worker due takes its turn; a beat sent more than a period after it was
        due is late, and so is each beat a worker fell behind by."""
        figures = self.figures
        self.counters.advance()
        while self.due and self.due[0][0] <= now:
            _, pid = heapq.heappop(self.due)
            if (worker := self.workers.get(pid)) is None:
                continue  # stopped
            if now >= worker.next_beat:
                behind = now - worker.next_beat
                skipped = int(behind / worker.period)
                figures["due"] += 1 + skipped
                figures["late"] += (behind > worker.period) + skipped
                figures["beats"] += 1
                worker.next_beat += skipped * worker.period
            heapq.heappush(self.due, (worker.turn(now), pid))
        if self.window and self.workers:
            self._probe()

    def _probe(self) -> None:
        """The lookups timed this turn: PROBES_PER_S a second, of running workers whose
        agent serves."""
        self._probes_owed += PROBES_PER_S * TICK_S
        while self._probes_owed >= 1.0:
            self._probes_owed -= 1.0
            worker = random.choice(list(self.workers.values()))
            if worker.phase == "running" and worker.host.agent is not None:
                self.probes.append(worker.probe())

    def _check_window(self, now: float) -> None:
        window = self.args.window.exists()
        if window and not self.window:
            self._churned_at = now
            if self.args.first and self.args.churn > 0:
                self._next_agent_restart = now + FIRST_AGENT_RESTART_S
        if not window:
            self._next_agent_restart = math.inf
        self.window = window

    def _churn(self, now: float) -> None:
        """Kill a fraction `--churn` of the churned kinds' workers per minute, each as at
        SIGKILL: gone, and its exit reported as a killed process's."""
        elapsed = now - self._churned_at
        self._churned_at = now
        if self.args.churn <= 0:
            return
        live = [w for w in self.workers.values()
                if w.kind in CHURN_KINDS and w.phase == "running"]
        self._churn_owed += self.args.churn * len(live) * elapsed / 60.0
        while self._churn_owed >= 1.0 and live:
            self._churn_owed -= 1.0
            worker = live.pop(random.randrange(len(live)))
            del self.workers[worker.pid]
            worker.close()
            self.events.send(msgpack.packb({"pid": worker.pid, "code": -signal.SIGKILL}))
            self.figures["kills"].append({"worker": worker.name, "pid": worker.pid,
                                          "at": time.time()})

    def _restart_agents(self, now: float) -> None:
        """One host's agent down for AGENT_OUTAGE_S every AGENT_RESTART_EVERY_S."""
        if self._down is not None:
            host, since = self._down
            if now - since >= AGENT_OUTAGE_S:
                host.bring_up()
                self._down = None
            return
        if now < self._next_agent_restart:
            return
        self._next_agent_restart = now + AGENT_RESTART_EVERY_S
        host = random.choice(list(self.hosts.values()))
        host.take_down()
        self._down = (host, now)
        self.figures["agent_restarts"].append({"host": f"h{host.index}", "at": time.time(),
                                               "outage_s": AGENT_OUTAGE_S})
        for worker in self.workers.values():  # its workers' queues hold what waits
            if worker.host is host:
                worker.next_log = max(worker.next_log, now + AGENT_OUTAGE_S)

    def write(self, final: bool = False) -> None:
        out = {**self.figures, **({"probes_s": self.probes} if final else {})}
        partial = self.args.out.with_suffix(".partial")
        partial.write_text(json.dumps(out))
        partial.replace(self.args.out)

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        for host in self.hosts.values():
            host.close()
        self.commands.close(linger=0)
        self.events.close(linger=0)
        self.context.term()
        self.workers_context.destroy(linger=0)


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
    parser.add_argument("--window", type=Path, required=True,
                        help="the bench's window file: churn and probes while it exists")
    parser.add_argument("--churn", type=float, default=0.0,
                        help="fraction of actors and servers killed per minute")
    parser.add_argument("--first", action="store_true",
                        help="the first host process: it restarts host agents")
    parser.add_argument("--simulate", choices=("workers", "agents"), default="workers")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop_signal)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    swarm: Swarm | None = None
    try:
        swarm = Swarm(args, keys_from_env(os.environ))
        swarm.run()
    except Stopped:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal waits for the close
            signal.signal(sig, signal.SIG_IGN)
        if swarm is not None:
            swarm.write(final=True)
            swarm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
