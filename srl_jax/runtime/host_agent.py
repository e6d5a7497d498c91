"""The host agent: one peer per host for the controller, in place of every worker there.

Without it every worker of a run is the controller's peer: a connection each for its
heartbeats, its log and its name requests, so the controller's load grows with the
workers. With it (the network name service on a Ray cluster: one per node, from
srl_jax/runtime/ray_backend.py) a host's workers talk to their host's agent alone, over
local `ipc://` sockets, and the agent to the controller:

- names: the agent serves its workers from a replica of the controller's table (a
  `NameServer` of its own), kept current by the controller's changes stream and a
  snapshot now and then; a register or unregister goes on to the controller. A
  worker's lookups, sweeps and config request end at the agent.
- heartbeats: the agent takes its workers' `stats` messages and sends them on in
  `stats_batch` messages, one every BATCH_S (more where one would pass the wire's
  header limit), which the controller takes heartbeat by heartbeat as before
  (`unbatch`): the same failure detection and restarts, from a few messages a second
  per host.
- logs: chunks go on as they came.

Its local sockets are at fixed addresses (`ipc://@srl_jax-<run>-<node>-<stream>`, Linux's
abstract namespace: nothing on disk, gone with the process, one namespace per network
namespace), with CURVE where the run has keys: an agent started again (Ray restarts a
killed one) binds the same addresses, and its workers' sockets reconnect by themselves,
keeping their endpoints meanwhile. Heartbeats that come while the agent is down wait in
the workers' queues (a skipped one is carried by the next), so a short gap kills no
worker; one longer than `runtime.heartbeat_timeout_s` is a dead host to the controller.
"""

from __future__ import annotations

import logging
import os
import socket as pysocket
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import zmq

from srl_jax.core.stream_table import CHANGES, LOGS, STATS, stream_of
from srl_jax.core.streams import NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.core.transport import CurveKeys, Transport, curve_connect
from srl_jax.core.wire import MAX_ARRAYS, MAX_HEADER_BYTES, Message
from srl_jax.runtime.name_server import (
    SWEEP_S,
    NameServer,
    NetworkNameService,
    change_of,
    fixed_endpoint,
)

log = logging.getLogger("host_agent")

BATCH_S = 0.25
"""How often the agent sends its host's heartbeats on (at most this much later)."""
BATCH_HEADER_BYTES = MAX_HEADER_BYTES // 2
"""A batch's metadata stays under this (the wire refuses headers over MAX_HEADER_BYTES)."""
QUEUE = 1024
"""Messages queued on each of the agent's sockets (ZMQ high-water mark)."""
HELD_BATCHES = 64
"""Batches kept while the controller takes none; past it the oldest are dropped (their
counters are carried by later heartbeats; their episode returns are lost, and counted)."""
POLL_MS = 50


def agent_address(run: str, node: str) -> str:
    """The base of a node's agent addresses (each socket adds `-<stream>`)."""
    return f"ipc://@srl_jax-{run}-{node}"


def batches(beats: list[tuple[dict[str, Any], dict[str, np.ndarray]]]
            ) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """`stats_batch` messages (meta, arrays) of heartbeats (meta, arrays), each under the
    wire's limits: meta `{"beats": [meta, ...]}`, arrays `<i>/<name>` of beat i."""
    metas: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    size = 0
    for meta, own in beats:
        grows = len(msgpack.packb(meta)) + 32 * len(own)
        if metas and (size + grows > BATCH_HEADER_BYTES or len(arrays) + len(own) > MAX_ARRAYS):
            yield {"beats": metas}, arrays
            metas, arrays, size = [], {}, 0
        arrays.update({f"{len(metas)}/{name}": array for name, array in own.items()})
        metas.append(meta)
        size += grows
    if metas:
        yield {"beats": metas}, arrays


def unbatch(message: Message) -> list[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """The heartbeats of a `stats` or `stats_batch` message (ValueError: a malformed batch)."""
    if message.kind == "stats":
        return [(message.meta, message.arrays)]
    metas = message.meta.get("beats")
    if not isinstance(metas, list) or not all(isinstance(meta, dict) for meta in metas):
        raise ValueError("stats_batch: 'beats' must be a list of heartbeats")
    beats: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = [(meta, {}) for meta in metas]
    for name, array in message.arrays.items():
        index, _, own = name.partition("/")
        if not index.isdigit() or int(index) >= len(beats) or not own:
            raise ValueError(f"stats_batch: array {name!r} belongs to no heartbeat")
        beats[int(index)][1][own] = array
    return beats


class HostAgent:
    """A host's agent, serving from threads of the process that makes it (a Ray actor,
    or a simulated host of `bench/swarm.py`)."""

    def __init__(self, context: zmq.Context, upstream: str, keys: CurveKeys | None,
                 at: str) -> None:
        """`upstream`: the controller's name service. `at`: the base of the local
        addresses (`agent_address`). Returns once the agent serves: it has the run's
        config and a first copy of its names (waiting, with backoff, for a controller
        that does not answer yet)."""
        self.at = at
        self.host = pysocket.gethostname()
        self.rejects = RejectCounter()
        self.dropped = {"batches": 0, "logs": 0}
        """What the agent let go because the controller took nothing for a while."""
        self._context = context
        self._stopping = threading.Event()
        self._forwards: list[tuple[str, str, str | None]] = []
        self._forwards_lock = threading.Lock()
        self.upstream = NetworkNameService(context, upstream, keys)
        config = self.upstream.run_config()
        local = Transport(context, keys=keys)
        self.names = NameServer(local, config, forward=self._forward, at=at)
        self._stats_in = self._bind(local, STATS.bind_type, STATS.key())
        self._logs_in = self._bind(local, LOGS.bind_type, LOGS.key())
        self._stats_out = self._connect(STATS.connect_type, STATS.key(), keys)
        self._logs_out = self._connect(LOGS.connect_type, LOGS.key(), keys)
        self._changes = self._connect(CHANGES.connect_type, CHANGES.key(), keys)
        self._changes.setsockopt(zmq.SUBSCRIBE, b"")
        self._replicate(self.upstream.table())
        self.local = local
        self._threads = [threading.Thread(target=target, name=name, daemon=True)
                         for target, name in ((self._relay, "agent-relay"),
                                              (self._uplink, "agent-uplink"))]
        for thread in self._threads:
            thread.start()
        log.info("host agent for %s serving at %s (pid %d)", upstream, at, os.getpid())

    @property
    def endpoint(self) -> str:
        """Where this host's workers find their name service (`SRL_JAX_NAMES`)."""
        return self.names.endpoint

    def close(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self.names.close()
        self.upstream.close()
        self.local.close()

    def _bind(self, local: Transport, kind: int, key: str) -> zmq.Socket:
        socket = make_socket(self._context, kind, hwm=QUEUE)
        local.bind(socket, self.names, key, fixed_endpoint(self.at, stream_of(key)))
        return socket

    def _connect(self, kind: int, key: str, keys: CurveKeys | None) -> zmq.Socket:
        socket = make_socket(self._context, kind, hwm=QUEUE)
        curve_connect(socket, self.upstream.lookup(key, self.upstream.patience_s), keys)
        return socket

    def _forward(self, op: str, key: str, endpoint: str | None) -> None:
        """A worker's register or unregister, for the uplink thread to pass on."""
        with self._forwards_lock:
            self._forwards.append((op, key, endpoint))

    def _replicate(self, table: dict[str, str]) -> None:
        """Take a snapshot of the controller's names (its own streams' excepted: the agent
        stands for them), forgetting what the controller no longer has."""
        theirs = {key: endpoint for key, endpoint in table.items() if _replicated(key)}
        for key in set(self.names.table()) - set(theirs):
            if _replicated(key):
                self.names.register(key, None)
        for key, endpoint in theirs.items():
            self.names.register(key, endpoint)

    def _uplink(self) -> None:
        """Changes from the controller, a snapshot every SWEEP_S, registers passed on."""
        next_snapshot = time.monotonic() + SWEEP_S
        while not self._stopping.is_set():
            if self._changes.poll(POLL_MS):
                while (received := receive(self._changes, CHANGES.connecter_receives,
                                           self.rejects)) is not None:
                    if (change := change_of(received[1])) is not None and _replicated(change[0]):
                        self.names.register(*change)
            with self._forwards_lock:
                forwards, self._forwards = self._forwards, []
            for op, key, endpoint in forwards:
                self._pass_on(op, key, endpoint)
            if time.monotonic() >= next_snapshot:
                next_snapshot = time.monotonic() + SWEEP_S
                try:
                    self._replicate(self.upstream.table())
                except TimeoutError as error:
                    log.warning("no snapshot of the names: %s; serving the copy held", error)

    def _pass_on(self, op: str, key: str, endpoint: str | None) -> None:
        try:
            if op == "register":
                self.upstream.register(key, endpoint)
            else:
                self.upstream.unregister(key)
        except (TimeoutError, ValueError) as error:
            log.warning("%s of '%s' not passed on to the controller: %s", op, key, error)

    def _relay(self) -> None:
        held: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = []
        next_batch = time.monotonic() + BATCH_S
        poller = zmq.Poller()
        poller.register(self._stats_in, zmq.POLLIN)
        poller.register(self._logs_in, zmq.POLLIN)
        beats: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = []
        while not self._stopping.is_set():
            wait = max(0.0, next_batch - time.monotonic())
            ready = dict(poller.poll(min(POLL_MS, wait * 1000)))
            if self._stats_in in ready:
                while (received := receive(self._stats_in, STATS.binder_receives,
                                           self.rejects)) is not None:
                    beats.extend(_beats_of(received[1], self.rejects))
            if self._logs_in in ready:
                self._pass_logs()
            if time.monotonic() >= next_batch:
                next_batch = time.monotonic() + BATCH_S
                held.extend(batches(beats))
                beats = []
                held = self._send_batches(held)

    def _send_batches(self, held: list[tuple[dict[str, Any], dict[str, np.ndarray]]]
                      ) -> list[tuple[dict[str, Any], dict[str, np.ndarray]]]:
        """Send what the controller takes; keep the rest (at most HELD_BATCHES)."""
        while held:
            meta, arrays = held[0]
            try:
                send(self._stats_out, "stats_batch", meta, arrays, flags=NOBLOCK)
            except zmq.Again:
                break
            held.pop(0)
        if len(held) > HELD_BATCHES:
            self.dropped["batches"] += len(held) - HELD_BATCHES
            log.warning("the controller takes no heartbeats; %d batches dropped",
                        len(held) - HELD_BATCHES)
            held = held[-HELD_BATCHES:]
        return held

    def _pass_logs(self) -> None:
        while (received := receive(self._logs_in, LOGS.binder_receives,
                                   self.rejects)) is not None:
            try:
                send(self._logs_out, "log", received[1].meta, received[1].arrays, flags=NOBLOCK)
            except zmq.Again:
                self.dropped["logs"] += 1


def _replicated(key: str) -> bool:
    """Whether the agent copies `key` from the controller (not the controller's own
    streams, which the agent binds for its host)."""
    try:
        return stream_of(key).binder != "controller"
    except KeyError:
        return False


def _beats_of(message: Message, rejects: RejectCounter
              ) -> list[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    try:
        return unbatch(message)
    except ValueError as error:
        rejects.reject(error)
        return []
