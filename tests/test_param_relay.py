"""Parameter relays (srl_jax/runtime/hosts/param_relay.py): the tree's shape, the agents'
relays over real sockets, a parent that goes away, and a killed agent (bench.param_fanout)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from srl_jax.dataflow.stream_table import LOGS, PARAMS, RELAY, STATS
from srl_jax.runtime.hosts import param_relay
from srl_jax.runtime.hosts.host_agent import HostAgent, agent_address
from srl_jax.runtime.hosts.param_relay import PolicyView, parent_rank, upstream_of, views_of
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.name_server import NameServer
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import Transport
from tests.conftest import REPO

ROOT = "tcp://learner"


def tree(indices: list[int], fanout: int) -> dict[int, str]:
    """Each relay's upstream, every relay knowing all the others."""
    relays = {index: f"tcp://relay-{index}" for index in indices}
    return {index: upstream_of(index, relays, ROOT, fanout) for index in indices}


@pytest.mark.parametrize("fanout", [1, 2, 8])
def test_each_sender_feeds_at_most_fanout_relays_and_every_relay_reaches_the_learner(
        fanout: int) -> None:
    rng = random.Random(fanout)
    for count in (1, 2, 7, 8, 9, 64, 65, 200):
        indices = sorted(rng.sample(range(3 * count), count))  # places left by lost hosts
        upstream = tree(indices, fanout)
        fed = {sender: sum(1 for up in upstream.values() if up == sender)
               for sender in set(upstream.values())}
        assert max(fed.values()) <= fanout
        assert fed[ROOT] == min(fanout, count)
        for index in indices:
            hops, at = 0, index
            while (up := upstream[at]) != ROOT:
                parent = int(up.rsplit("-", 1)[1])
                assert parent < at, "a parent has a lower index: no cycle"
                at, hops = parent, hops + 1
            assert hops <= max(1, math.ceil(math.log(count, fanout))) if fanout > 1 else \
                hops == indices.index(index)


def test_a_relay_not_yet_in_the_names_ranks_itself() -> None:
    assert upstream_of(5, {}, ROOT, 2) == ROOT
    assert upstream_of(5, {1: "a", 2: "b"}, ROOT, 2) == "a"  # rank 2: parent rank 0
    assert [parent_rank(r, 3) for r in range(13)] == [None] * 3 + [0] * 3 + [1] * 3 + \
        [2] * 3 + [3]


def test_views_hold_each_policys_learner_and_relays() -> None:
    views = views_of({PARAMS.key(): "tcp://l", RELAY.key(index=3): "tcp://r3",
                      PARAMS.key("red"): "tcp://lr", RELAY.key("red", 0): "tcp://rr0",
                      STATS.key(): "tcp://s", "port.bogus": "x"})
    assert views == {"default": PolicyView("tcp://l", {3: "tcp://r3"}),
                     "red": PolicyView("tcp://lr", {0: "tcp://rr0"})}


class Learner:
    """The controller's names and streams an agent needs, and a learner's PUB."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        transport = Transport(self.context)
        self.names = NameServer(transport, "{}\n")
        self.sinks = [make_socket(self.context, stream.bind_type) for stream in (STATS, LOGS)]
        for socket, stream in zip(self.sinks, (STATS, LOGS), strict=True):
            transport.bind(socket, self.names, stream.key())
        self.pub = make_socket(self.context, PARAMS.bind_type)
        transport.bind(self.pub, self.names, PARAMS.key())

    def publish(self, version: int) -> None:
        send(self.pub, "params", {"version": version, "started_ms": 1},
             {"w": np.full(64, version, np.float32)})

    def close(self) -> None:
        """Everything closed before the context ends: a context that the garbage collector
        ends with sockets still open blocks the collecting thread for good."""
        self.names.close()
        self.context.destroy(linger=0)


@pytest.fixture
def learner() -> Iterator[Learner]:
    learner = Learner()
    yield learner
    learner.close()


def subscribe(context: zmq.Context, agent: HostAgent) -> zmq.Socket:
    """A worker's parameter subscription on the agent's host (it asks the agent)."""
    names = NetworkNameService(context, agent.endpoint, None)
    endpoint = names.lookup(PARAMS.key(), 10)
    names.close()
    socket = make_socket(context, zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    return socket


def newest(socket: zmq.Socket, seen: int) -> int:
    while (received := receive(socket, PARAMS.connecter_receives, RejectCounter())) is not None:
        seen = max(seen, received[1].meta["version"])
    return seen


def publish_until(learner: Learner, sockets: list[zmq.Socket], version: int,
                  timeout_s: float) -> list[int]:
    """Publish `version`, `version + 1`, ... every 0.1 s until each socket has the newest
    (the newest each has, at the deadline)."""
    seen = [0] * len(sockets)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        learner.publish(version)
        time.sleep(0.1)
        seen = [newest(socket, had) for socket, had in zip(sockets, seen, strict=True)]
        if min(seen) == version:
            return seen
        version += 1
    return seen


def test_a_relay_whose_parent_is_gone_takes_the_stream_from_above(
        learner: Learner, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain (fan-out 1): learner, agent 0, 1, 2. The workers ask their agent for the
    params key and get its relay's local address; the learner's socket feeds one relay.
    Agent 1 goes (its relay key stays registered, as a dead host's would): agent 2's
    relay leaves it out after SILENT_S and takes the stream from agent 0's."""
    monkeypatch.setattr(param_relay, "SILENT_S", 1.0)
    contexts = [zmq.Context() for _ in range(3)]
    agents = [HostAgent(context, learner.names.endpoint, None,
                        agent_address("relay-test", f"h{i}"), index=i, fanout=1)
              for i, context in enumerate(contexts)]
    try:
        sockets = [subscribe(learner.context, agent) for agent in agents]
        assert {s.getsockopt_string(zmq.LAST_ENDPOINT) for s in sockets} == {
            param_relay.relay_address(agent_address("relay-test", f"h{i}"), "default")
            for i in range(3)}
        first = publish_until(learner, sockets, 1, 20)
        assert first[0] >= 1 and len(set(first)) == 1, first
        relays = [agent.relays.relays["default"] for agent in agents]
        chain = [learner.names.get(PARAMS.key()), relays[0].endpoint, relays[1].endpoint]
        deadline = time.monotonic() + 10  # each relay ranks itself among those it knows
        while [relay.target for relay in relays] != chain and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [relay.target for relay in relays] == chain
        agents[1].close()
        seen = publish_until(learner, [sockets[0], sockets[2]], 1000, 20)
        assert seen[0] == seen[1] >= 1000, "the host below the gone one is fed again"
        assert relays[2].target == relays[0].endpoint
        assert learner.names.get(RELAY.key(index=1)) is not None, "left out, not forgotten"
    finally:
        for agent in (agents[0], agents[2]):
            agent.close()
        for context in contexts:
            context.destroy(linger=0)


@pytest.mark.slow
def test_an_agent_killed_mid_run_comes_back_and_every_subscriber_ends_on_the_newest(
        tmp_path: Path) -> None:
    """bench.param_fanout with real agent processes, host 0's killed (SIGKILL) halfway and
    started again: the hosts below it in the tree (fan-out 2: hosts 2 and 3) and its own
    subscribers end on the newest version, and the learner still sends each version
    twice."""
    out = tmp_path / "fanout.json"
    bench = subprocess.run([sys.executable, "-m", "bench.param_fanout", "--subscribers", "12",
                            "--mb", "0.5", "--hosts", "4", "--fanout", "2", "--versions", "6",
                            "--period-s", "0.3", "--tail-s", "30", "--kill-host", "0",
                            "--json", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=240)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    results = json.loads(out.read_text())
    assert results["subscribers"] == 12 and results["subscribers_received_all"]
    assert results["learner_bytes_per_version"] <= 2 * results["param_bytes"]
    assert results["rejected"] == 0 and results["killed_host"] == 0
    assert results["arrival_p99_s"] < 5
