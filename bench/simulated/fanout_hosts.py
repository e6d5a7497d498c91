"""Simulated hosts and subscribers for `bench/param_fanout.py`, each in a process of its
own (spawned; nothing here imports JAX, so they start in a fraction of a second)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from bench.harness.launcher import raise_on_sigterm
from srl_jax.dataflow.stream_table import NAMES, PARAMS
from srl_jax.runtime.hosts.host_agent import HostAgent, agent_address
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.name_server import fixed_endpoint
from srl_jax.wire.streams import RejectCounter, make_socket, receive

POLL_MS = 50


def host_names(run: str, host: int) -> str:
    """Where host `host`'s workers find their name service (their agent)."""
    return fixed_endpoint(agent_address(run, f"h{host}"), NAMES)


def run_agent(run: str, upstream: str, host: int, fanout: int) -> None:
    """A simulated host's agent, until it is killed or terminated."""
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    agent = HostAgent(zmq.Context(), upstream, None, agent_address(run, f"h{host}"), host,
                      fanout)
    try:
        threading.Event().wait()
    finally:
        agent.close()


def run_subscribers(run: str, hosts: list[int], per_host: list[int], queue: int, out: str,
                    ready: Any, caught_up: Any, newest: int, direct: str | None) -> None:
    """The subscribers of `hosts` (`per_host[i]` on `hosts[i]`): each notes when each
    version came, until terminated; then they write {subscriber: {version: time}}.
    `ready` (an event) is set once each has had a message (the learner's warm-up), and
    `caught_up` once each has had version `newest`.
    `direct`: ask this name service (the controller's), not the host's agent: each
    subscriber on the learner's own socket, as without host agents."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    context = zmq.Context()
    sockets: dict[str, zmq.Socket] = {}
    for host, count in zip(hosts, per_host, strict=True):
        endpoint = NetworkNameService(context, direct or host_names(run, host), None).lookup(
            PARAMS.key(), 60)
        for i in range(count):
            socket = make_socket(context, zmq.SUB, hwm=queue)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(endpoint)
            sockets[f"h{host}-s{i}"] = socket
    poller = zmq.Poller()
    for socket in sockets.values():
        poller.register(socket, zmq.POLLIN)
    arrivals: dict[str, dict[int, float]] = {name: {} for name in sockets}
    rejects = RejectCounter()
    names = {socket: name for name, socket in sockets.items()}
    while not stopping.is_set():
        for socket, _ in poller.poll(POLL_MS):
            while (received := receive(socket, PARAMS.connecter_receives, rejects)) is not None:
                arrivals[names[socket]].setdefault(received[1].meta["version"], time.time())
        if not ready.is_set() and all(arrivals.values()):
            ready.set()
        if not caught_up.is_set() and all(newest in got for got in arrivals.values()):
            caught_up.set()
    Path(out).write_text(json.dumps({"arrivals": arrivals, "rejected": rejects.count}))


