"""Parameter fan-out, measured with real sockets: what the learner sends per version, and
how soon each version reaches every subscriber through the host agents' relays.

    python -m bench.param_fanout --subscribers 64 --mb 6.7 [--hosts H] [--fanout K]
        [--versions V] [--period-s P] [--tail-s T] [--kill-host I] [--direct] [--json PATH]

The real parts: the controller's `NameServer`, a real `HostAgent` per simulated host
(each in a process of its own, with its relays: srl_jax/runtime/hosts/param_relay.py),
and the learner's `ParamPublisher` on the params stream's PUB socket, publishing a
version of `--mb` MB of float32 every `--period-s`. The subscribers are SUB sockets,
`--subscribers` of them spread over the hosts (several hosts' subscribers share a
process), each looking up the params key at its host's agent as a worker does and
noting when each version arrives.

The versions go out once every subscriber has had a first one and the relays' tree has
formed. After the last, the learner sends it again each second until every subscriber
has it, for at most `--tail-s`.

`--kill-host I` kills host I's agent (SIGKILL, by pid) halfway and starts it again a
second later, as Ray does: the figures then say whether every subscriber still ends on
the newest version. `--direct` runs no agents: every subscriber on the learner's socket,
the fan-out as it is without relays (the local backend's, which has no agents).

Figures: `param_bytes` (one version's message), `learner_bytes_per_version` (the
message times the peers attached to the learner's socket when it sent, the most over
the versions: a PUB sends each message once to each; a ZMQ monitor on the socket counts
them), `subscribers`, `subscribers_received_all` (each got the newest version),
`versions_received_fraction` (of every subscriber's versions, those that came: a
subscriber keeps only the newest, so one that is behind may skip some),
`arrival_p50_s` and `arrival_p99_s` (publish to arrival, over every version each
subscriber got). Results go to `bench/results/param_fanout.json` (`--json PATH`
elsewhere), one row per subscriber count, with the commit and the machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from bench.harness.launcher import BenchError, busy_warning, raise_on_sigterm, release_workdir
from bench.harness.machine import git_commit, nproc, write_results
from bench.simulated.fanout_hosts import run_agent, run_subscribers
from bench.swarm import read_results
from policy.param_stream import ParamPublisher
from srl_jax.config.schema import LearnerConfig
from srl_jax.dataflow.stream_table import LOGS, PARAMS, STATS
from srl_jax.runtime.name_server import NameServer
from srl_jax.wire.streams import make_socket
from srl_jax.wire.transport import Transport

SUBSCRIBER_PROCESSES = 4
WARM_UP_TIMEOUT_S = 120.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.param_fanout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=64)
    parser.add_argument("--mb", type=float, default=6.7, help="parameter bytes per version, MB")
    parser.add_argument("--hosts", type=int, default=None,
                        help="simulated hosts, each with an agent (default: a host per 4 "
                             "subscribers)")
    parser.add_argument("--fanout", type=int, default=8, help="runtime.param_fanout")
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--period-s", type=float, default=1.0, help="seconds between versions")
    parser.add_argument("--tail-s", type=float, default=3.0,
                        help="after the last version, the learner sends it again every second "
                             "(as learner.republish_interval_s does) until every subscriber "
                             "has it, for at most this long")
    parser.add_argument("--kill-host", type=int, default=None,
                        help="kill this host's agent halfway and start it again")
    parser.add_argument("--direct", action="store_true",
                        help="no host agents: every subscriber on the learner's socket (the "
                             "fan-out without relays, to compare)")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default bench/results/param_fanout.json)")
    args = parser.parse_args(argv)
    args.hosts = args.hosts or math.ceil(args.subscribers / 4)
    if not 1 <= args.hosts <= args.subscribers:
        parser.error("--hosts must be between 1 and --subscribers")
    if args.kill_host is not None and (args.direct or not 0 <= args.kill_host < args.hosts):
        parser.error("--kill-host must name one of the hosts (0 to --hosts - 1), with agents")
    return args


class PeerCount:
    """The peers attached to a socket now, from its ZMQ monitor."""

    def __init__(self, socket: zmq.Socket) -> None:
        self._monitor = socket.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.peers = 0

    def now(self) -> int:
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            self.peers += 1 if event == zmq.EVENT_ACCEPTED else -1
        return self.peers


def spread(subscribers: int, hosts: int) -> list[int]:
    """Subscribers per host, as even as they go."""
    return [subscribers // hosts + (host < subscribers % hosts) for host in range(hosts)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    busy_warning()
    spawn = multiprocessing.get_context("spawn")
    context = zmq.Context()
    transport = Transport(context)
    names = NameServer(transport, "{}\n")
    sinks = []
    for stream in (STATS, LOGS):  # the controller's, which an agent connects to
        sinks.append(make_socket(context, stream.bind_type))
        transport.bind(sinks[-1], names, stream.key())
    queue = LearnerConfig().param_queue
    learner = make_socket(context, PARAMS.bind_type, hwm=queue)
    peers = PeerCount(learner)
    transport.bind(learner, names, PARAMS.key())
    publisher = ParamPublisher(learner, started_ms=1, log=logging.getLogger("bench"))
    params = {"w": np.ones(int(args.mb * 2**20 / 4), np.float32)}
    print(f"param_fanout: {args.subscribers} subscribers on {args.hosts} hosts, "
          f"{args.mb:g} MB a version, "
          f"{'no relays' if args.direct else f'fan-out {args.fanout}'}, on {nproc()} cores")
    run = f"fanout{os.getpid()}"  # the agents' local addresses, apart from another run's
    agents = Agents(spawn, run, names.endpoint, 0 if args.direct else args.hosts, args.fanout)
    workdir = Path(tempfile.mkdtemp(prefix="srl_jax-fanout-"))
    counts = spread(args.subscribers, args.hosts)
    groups = [list(range(args.hosts))[p::SUBSCRIBER_PROCESSES]
              for p in range(min(SUBSCRIBER_PROCESSES, args.hosts))]
    ready = [spawn.Event() for _ in groups]
    caught_up = [spawn.Event() for _ in groups]
    subscribers = [spawn.Process(target=run_subscribers, args=(
        run, group, [counts[h] for h in group], queue, str(workdir / f"subscribers-{p}.json"),
        ready[p], caught_up[p], args.versions, names.endpoint if args.direct else None))
        for p, group in enumerate(groups)]
    for process in subscribers:
        process.start()
    try:
        warm_up(publisher, params, ready, peers,
                args.subscribers if args.direct else min(args.fanout, args.hosts))
        published, learner_peers = publish(args, publisher, params, peers, agents, caught_up)
    except BenchError as error:
        print(f"bench.param_fanout: {error}", file=sys.stderr)
        return 1
    finally:
        for process in subscribers:
            process.terminate()
        for process in subscribers:
            process.join(timeout=30)
        agents.stop()
        names.close()
    written = [json.loads(path.read_text()) for path in sorted(workdir.glob("*.json"))]
    release_workdir(workdir, keep=False)
    results = figures(args, published, learner_peers, written, params["w"].nbytes)
    for key, value in results.items():
        print(f"  {key:28s} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        path = args.json
    else:
        rows = (read_results("param_fanout") or {}).get("rows", {})
        mode = "direct" if args.direct else "relays"
        rows[f"{args.subscribers}-{args.mb:g}-{mode}"] = {
            **results, "commit": git_commit(), "date": time.strftime("%Y-%m-%d")}
        path = write_results("param_fanout", {"rows": rows})
    print(f"written to {path}")
    return 0 if results["subscribers_received_all"] else 1


def warm_up(publisher: ParamPublisher, params: dict[str, np.ndarray], ready: list[Any],
            peers: PeerCount, settled_peers: int) -> None:
    """Send version 0 every half second until every subscriber has had it (through its
    host's relay, which the agent starts once it sees the learner's key) and the tree has
    formed: the learner down to `settled_peers` (a relay that started before the others
    had registered takes the learner's stream until it sees its parent)."""
    deadline = time.monotonic() + WARM_UP_TIMEOUT_S
    while not all(event.is_set() for event in ready) or peers.now() > settled_peers:
        if time.monotonic() > deadline:
            raise BenchError(f"not every subscriber had a version, or the relays' tree had not "
                             f"formed, after {WARM_UP_TIMEOUT_S:.0f} s")
        publisher.publish(params, 0)
        time.sleep(0.5)


class Agents:
    """The simulated hosts' agents, a spawned process each, stopped by their pids."""

    def __init__(self, spawn: Any, run: str, upstream: str, hosts: int, fanout: int) -> None:
        self._spawn = spawn
        self._args = run, upstream
        self._fanout = fanout
        self._processes: dict[int, Any] = {}
        for host in range(hosts):
            self.start(host)

    def start(self, host: int) -> None:
        process = self._spawn.Process(target=run_agent, args=(*self._args, host, self._fanout),
                                      daemon=True)
        process.start()
        self._processes[host] = process

    def kill_and_restart(self, host: int) -> None:
        """SIGKILL host `host`'s agent, and start it again a second later, as Ray does."""
        self._processes[host].kill()
        self._processes[host].join()
        time.sleep(1.0)
        self.start(host)

    def stop(self) -> None:
        for process in self._processes.values():
            process.kill()
            process.join()


def publish(args: argparse.Namespace, publisher: ParamPublisher, params: dict[str, np.ndarray],
            peers: PeerCount, agents: Agents, caught_up: list[Any]
            ) -> tuple[dict[int, float], list[int]]:
    """Publish the versions (killing and restarting a host's agent halfway where asked),
    then the newest again each second until every subscriber has it or `--tail-s` is
    over: each version's publish time, and the learner's peers at each publish."""
    published: dict[int, float] = {}
    learner_peers = []
    for version in range(1, args.versions + 1):
        published[version] = time.time()
        learner_peers.append(peers.now())
        publisher.publish(params, version)
        if version == args.versions // 2 and args.kill_host is not None:
            print(f"  killing host {args.kill_host}'s agent at version {version}")
            agents.kill_and_restart(args.kill_host)
        time.sleep(args.period_s)
    tail = time.monotonic() + args.tail_s
    while time.monotonic() < tail:  # the learner's republish of its newest version
        learner_peers.append(peers.now())
        publisher.publish(params, args.versions)
        if all_set_within(caught_up, 1.0):
            break
    return published, learner_peers


def all_set_within(events: list[Any], seconds: float) -> bool:
    """Whether every event is set within `seconds` (checked every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not all(event.is_set() for event in events):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def figures(args: argparse.Namespace, published: dict[int, float], learner_peers: list[int],
            written: list[dict[str, Any]], param_bytes: int) -> dict[str, Any]:
    arrivals = {name: {int(v): t for v, t in got.items()}
                for part in written for name, got in part["arrivals"].items()}
    newest = max(published)
    delays = [t - published[v] for got in arrivals.values() for v, t in got.items()
              if v in published]
    expected = len(arrivals) * len(published)
    return {"subscribers": len(arrivals), "hosts": args.hosts,
            "fanout": None if args.direct else args.fanout, "relays": not args.direct,
            "param_bytes": param_bytes,
            "learner_peers_max": max(learner_peers),
            "learner_bytes_per_version": max(learner_peers) * param_bytes,
            "subscribers_received_all": len(arrivals) == args.subscribers and all(
                newest in got for got in arrivals.values()),
            "versions_received_fraction": round(len(delays) / expected, 3) if expected else 0.0,
            "arrival_p50_s": round(percentile(delays, 50), 4),
            "arrival_p99_s": round(percentile(delays, 99), 4),
            "versions": len(published), "period_s": args.period_s,
            "killed_host": args.kill_host,
            "rejected": sum(part["rejected"] for part in written)}


if __name__ == "__main__":
    sys.exit(main())
