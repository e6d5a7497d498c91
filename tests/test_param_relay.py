"""Parameter relays (srl_jax/runtime/hosts/param_relay.py): the tree's shape, the agents'
relays over real sockets, a parent that goes away, and a killed agent (bench.param_fanout)."""

from __future__ import annotations

import itertools
import json
import math
import os
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
from tests.conftest import REPO, wait_for

ROOT = "tcp://learner"
RUN = f"relay-test-{os.getpid()}"
"""The agents' local addresses are abstract sockets, one namespace for the machine: this
process's own, so that two test runs at once never meet."""


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


SCALE = 40
"""The relays' clocks in the tests below, a fortieth of the defaults: SILENT_S 0.25 s,
DOWN_S 0.75 s, notes every 25 ms, a version every 50 ms (2 s at the defaults); 3 s of
the test are 2 minutes, four DOWN_S, of a cluster."""
PERIOD_S = 2.0 / SCALE
WINDOW_S = 120.0 / SCALE


@pytest.fixture
def fast_relays(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SILENT_S", "DOWN_S", "NOTE_S", "RESEND_S"):
        monkeypatch.setattr(param_relay, name, getattr(param_relay, name) / SCALE)
    monkeypatch.setattr(param_relay, "POLL_MS", param_relay.POLL_MS // SCALE)


def chain(learner: Learner, count: int) -> tuple[list[HostAgent], list[zmq.Socket]]:
    """`count` agents in a chain (fan-out 1) below the learner, and a subscriber on each
    agent's host (it asks its agent for the params key: the relay's local address), once
    each relay takes the stream from the one before it."""
    agents: list[HostAgent] = []
    try:
        for i in range(count):
            agents.append(HostAgent(zmq.Context(), learner.names.endpoint, None,
                                    agent_address(RUN, f"h{i}"), index=i, fanout=1))
        sockets = [subscribe(learner.context, agent) for agent in agents]
        assert {s.getsockopt_string(zmq.LAST_ENDPOINT) for s in sockets} == {
            param_relay.relay_address(agent_address(RUN, f"h{i}"), "default")
            for i in range(count)}
        relays = [wait_for(lambda agent=agent: agent.relays.relays.get("default"), 10,
                           "the agent's relay") for agent in agents]
        wanted = [learner.names.get(PARAMS.key()), *(relay.endpoint for relay in relays[:-1])]
        deadline = time.monotonic() + 10  # each relay ranks itself among those it knows
        while [relay.target for relay in relays] != wanted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [relay.target for relay in relays] == wanted
    except BaseException:
        close_all(agents)
        raise
    return agents, sockets


def received(learner: Learner, sockets: list[zmq.Socket], seconds: float, version: int
             ) -> list[dict[int, float]]:
    """Publish a version every PERIOD_S for `seconds`, from `version` on: when each
    socket received each version."""
    arrivals: list[dict[int, float]] = [{} for _ in sockets]
    poller = zmq.Poller()
    for socket in sockets:
        poller.register(socket, zmq.POLLIN)
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while (now := time.monotonic()) < end:
        if now >= next_at:
            learner.publish(version)
            version, next_at = version + 1, next_at + PERIOD_S
        ready = dict(poller.poll(max(0, int((next_at - time.monotonic()) * 1000))))
        for socket, times in zip(sockets, arrivals, strict=True):
            if socket in ready:
                while (got := receive(socket, PARAMS.connecter_receives,
                                      RejectCounter())) is not None:
                    times.setdefault(got[1].meta["version"], time.monotonic())
    return arrivals


def close_all(agents: list[HostAgent]) -> None:
    for agent in agents:
        agent.close()
        agent._context.destroy(linger=0)


def test_a_dead_parents_key_goes_and_its_subtree_misses_no_version_after(
        learner: Learner, fast_relays: None) -> None:
    """A chain: learner, agents 0, 1, 2. Agent 1 dies (its sockets close; nobody
    unregisters anything for it): agent 2's relay finds it silent for SILENT_S, takes the
    stream from agent 0's and unregisters agent 1's key. From then on, for the rest of
    the 2 minutes (scaled), agent 2's host receives every version, no gap longer than a
    few periods: it never goes back to the dead parent after DOWN_S (before, the key
    stayed, and each DOWN_S cost another SILENT_S of nothing). Before the death, and for
    agent 0's host throughout, every version arrives."""
    agents, sockets = chain(learner, 3)
    try:
        before = received(learner, sockets, 10 * PERIOD_S, 1)
        assert all(sorted(times)[-3:] == [8, 9, 10] for times in before), before
        relays = [agent.relays.relays["default"] for agent in agents]
        agents[1].close()
        died = time.monotonic()
        above, below = received(learner, [sockets[0], sockets[2]], WINDOW_S, 11)
        below = {version: at for version, at in below.items() if version >= 11}
    finally:
        close_all([agents[0], agents[2]])
        agents[1]._context.destroy(linger=0)
    assert sorted(above) == list(range(11, max(above) + 1)), "agent 0's host misses nothing"
    back = min(below)  # the first version after the gap: the newest, resent on joining
    assert below[back] - died <= param_relay.SILENT_S + 4 * PERIOD_S, "one SILENT_S"
    assert sorted(below) == list(range(back, max(below) + 1)), "every version after"
    arrivals = [below[version] for version in sorted(below)]
    assert max(b - a for a, b in itertools.pairwise(arrivals)) < param_relay.SILENT_S
    assert max(above) - max(below) <= 1
    assert relays[2].target == relays[0].endpoint
    assert learner.names.get(RELAY.key(index=1)) is None, "the dead node's key is gone"
    assert learner.names.get(RELAY.key(index=2)) == relays[2].endpoint


def test_a_stuck_parent_is_left_out_and_registers_again_once_it_moves(
        learner: Learner, fast_relays: None) -> None:
    """Agent 0's relay thread stops (stuck on its lock) with its sockets connected: no
    version and no note reaches agent 1, whose relay leaves it out after SILENT_S and
    takes the learner's stream. Agent 0, moving again, finds its key gone (agent 1 took
    it for dead) and registers it again."""
    agents, sockets = chain(learner, 2)
    relays = [agent.relays.relays["default"] for agent in agents]
    try:
        with agents[0].relays._lock:
            arrivals = received(learner, [sockets[1]], 0.75, 1)[0]
            assert relays[1].target == learner.names.get(PARAMS.key())
            assert learner.names.get(RELAY.key(index=0)) is None
        assert max(arrivals) >= 0.75 / PERIOD_S - 2, "fed from the learner"
        assert len(arrivals) >= (0.75 - param_relay.SILENT_S) / PERIOD_S - 4
        wait_for(lambda: learner.names.get(RELAY.key(index=0)) == relays[0].endpoint, 10,
                 "agent 0's key registered again")
    finally:
        close_all(agents)


def test_a_parent_behind_its_own_parent_is_left_out(learner: Learner,
                                                    fast_relays: None) -> None:
    """The test plays agent 0's relay, connected and noting every few ms that it holds
    version 1 while its parent holds 5: agent 1's relay takes it for stalled after
    SILENT_S and takes the learner's stream; the lagging parent, alive, keeps its key."""
    stalled = make_socket(learner.context, zmq.XPUB)
    endpoint = f"tcp://127.0.0.1:{stalled.bind_to_random_port('tcp://127.0.0.1')}"
    learner.names.register(RELAY.key(index=0), endpoint)
    agents = [HostAgent(zmq.Context(), learner.names.endpoint, None,
                        agent_address(RUN, "h1"), index=1, fanout=1)]
    try:
        relay = wait_for(lambda: agents[0].relays.relays.get("default"), 10, "agent 1's relay")
        wait_for(lambda: relay.target == endpoint and relay.connected, 10, "the stalled parent")
        deadline = time.monotonic() + 10
        while relay.target == endpoint and time.monotonic() < deadline:
            send(stalled, "relay_note", {"newest": [1, 1], "above": [1, 5]})
            time.sleep(param_relay.NOTE_S)
        assert relay.target == learner.names.get(PARAMS.key())
        assert relay.silent_for(time.monotonic()) < param_relay.SILENT_S, "heard, not silent"
        assert learner.names.get(RELAY.key(index=0)) == endpoint
    finally:
        close_all(agents)
        stalled.close(linger=0)


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
