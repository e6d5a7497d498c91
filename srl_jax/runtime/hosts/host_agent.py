"""The host agent: one peer per host for the controller, in place of every worker there.

Without it every worker of a run is the controller's peer: a connection each for its
heartbeats, its log and its name requests, so the controller's load grows with the
workers. With it (the network name service on a Ray cluster: one per node, from
srl_jax/runtime/ray_backend.py) a host's workers talk to their host's agent alone, over
local `ipc://` sockets, and the agent to the controller:

- names: the agent serves its workers from a replica of the controller's table (a
  `NameServer` of its own), kept current by the controller's changes stream and a
  snapshot now and then; a register or unregister goes on to the controller. A change
  copied in and a register to pass on each wake the thread that acts on it (`Wakeup`):
  a lookup held here for a key that a worker on another host registers is answered at
  once, not a poll later. A worker's lookups, sweeps and config request end at the agent.
- heartbeats: the agent takes its workers' `stats` messages and sends them on in
  `stats_batch` messages, one every BATCH_S (more where one would pass the wire's
  header limit), which the controller takes heartbeat by heartbeat as before
  (`unbatch`): the same failure detection and restarts, from a few messages a second
  per host. A worker's heartbeat goes on whole at most every FULL_EVERY_S (at once
  where its phase or what it waits on changed); in between the batch says only that it
  is alive (`alive`: [worker, pid, since], `since` the wall time its wait began, or
  None where it waits on nothing), and its episode returns wait for its next whole one.
  A real worker's `since` moves every beat (an actor's oldest pending request, a
  server's last batch), so only what it waits on decides; the sign keeps status.json's
  `waiting_since` current. Counters are cumulative, so the controller's rows lose
  nothing but freshness, and its work per worker falls by three quarters.
- logs: chunks go on as they came.
- parameters: the agent relays each policy's parameters to its host, in a tree with the
  other agents' relays (srl_jax/runtime/hosts/param_relay.py), and answers its workers' lookup
  of a policy's params key with its relay's local address.

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
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from srl_jax.config.operations import RuntimeConfig
from srl_jax.dataflow.stream_table import CHANGES, LOGS, NAMES, PARAMS, STATS, stream_of
from srl_jax.runtime.hosts.param_relay import Relays
from srl_jax.runtime.name_client import SWEEP_S, NetworkNameService, change_of
from srl_jax.runtime.name_server import NameServer, Wakeup, fixed_endpoint
from srl_jax.runtime.worker_records import waiting_field
from srl_jax.wire.codec import MAX_ARRAYS, MAX_HEADER_BYTES, Message
from srl_jax.wire.streams import LOOPBACK, NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import CurveKeys, Transport, curve_connect

log = logging.getLogger("host_agent")

BATCH_S = 0.25
"""How often the agent sends its host's heartbeats on (at most this much later)."""
FULL_EVERY_S = 2.0
"""How often a worker's heartbeat goes on whole, counters and all: at 10,000 workers the
controller's decoding is most of its work, and 2 s rather than 1 s takes a quarter off
(bench/swarm.py); a row's counters are then up to 2 s old, its rates as smooth."""
FORGET_S = 120.0
"""A worker process not heard from for this long is forgotten (it was replaced)."""
BATCH_HEADER_BYTES = MAX_HEADER_BYTES // 2
"""A batch's metadata stays under this (the wire refuses headers over MAX_HEADER_BYTES)."""
QUEUE = 1024
"""Messages queued on each of the agent's sockets (ZMQ high-water mark)."""
SIGN_BYTES = 48
"""A sign of life's share of a batch's header (msgpack: 16 bytes and the worker's name;
a longer name eats into the wire's limit, twice BATCH_HEADER_BYTES)."""
SINCE_TYPES = (float, int, type(None))
"""What a sign of life's `since` may be (a wall time, or None)."""
HELD_BATCHES = 64
"""Batches kept while the controller takes none; past it the oldest are dropped (their
counters are carried by later heartbeats; their episode returns are lost, and counted)."""
UPLINK_POLL_MS = 200
"""How long the uplink waits for a change or a register to pass on before it checks the
snapshot's time."""
STOOD_FOR = (STATS, LOGS, NAMES, CHANGES)
"""The controller's streams the agent binds for its host; its others (a population's
rows and lineage) a worker reaches at the controller's own address."""


def agent_address(run: str, node: str) -> str:
    """The base of a node's agent addresses (each socket adds `-<stream>`)."""
    return f"ipc://@srl_jax-{run}-{node}"


Beat = tuple[dict[str, Any], dict[str, np.ndarray]]
"""A heartbeat: its meta and its arrays."""


@dataclass
class _Forwarded:
    """What the agent last sent on whole for one worker process, and what waits."""

    phase: Any
    waits_on: str | None
    at: float
    arrays: list[dict[str, np.ndarray]] = field(default_factory=list)


class Coalescer:
    """Which heartbeats go on whole, and which only as a sign of life (the module's
    docstring says why)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S) -> None:
        self.full_every_s = full_every_s
        self._forwarded: dict[tuple[Any, Any], _Forwarded] = {}

    def take(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], now: float
             ) -> Beat | None:
        """The heartbeat to send on whole (its arrays with those that waited), or None
        where a sign of life does."""
        key = (meta.get("worker"), meta.get("pid"))
        last = self._forwarded.get(key)
        waits_on = waiting[0] if (waiting := waiting_field(meta.get("waiting"))) else None
        if last is not None and now - last.at < self.full_every_s \
                and meta.get("phase") == last.phase and waits_on == last.waits_on:
            if arrays:
                last.arrays.append(arrays)
            return None
        waited = last.arrays if last is not None else []
        self._forwarded[key] = _Forwarded(meta.get("phase"), waits_on, now)
        return meta, joined([*waited, arrays])

    def forget_old(self, now: float) -> None:
        """Forget the processes not heard from for FORGET_S (replaced or gone)."""
        for key in [k for k, f in self._forwarded.items() if now - f.at > FORGET_S]:
            del self._forwarded[key]


def sign_of_life(meta: dict[str, Any]) -> list[Any]:
    """What a batch says of a heartbeat not sent on whole: [worker, pid, since], `since`
    the wall time of the wait it reports (None: it waits on nothing, or says so wrongly)."""
    waiting = waiting_field(meta.get("waiting"))
    return [meta.get("worker"), meta.get("pid"), waiting[1] if waiting else None]


def joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Heartbeat arrays of several heartbeats as one: each name's arrays end to end."""
    parts = [part for part in parts if part]
    if len(parts) <= 1:
        return parts[0] if parts else {}
    names = dict.fromkeys(name for part in parts for name in part)
    return {name: np.concatenate([part[name] for part in parts if name in part])
            for name in names}


def batches(beats: list[Beat], alive: list[list[Any]] | None = None
            ) -> Iterator[Beat]:
    """`stats_batch` messages (meta, arrays) of heartbeats, each under the wire's limits:
    meta `{"beats": [meta, ...], "alive": [sign_of_life, ...]}`, arrays `<i>/<name>` of
    beat i. The signs of life go with the first, those past its room in messages of
    their own."""
    metas: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    room = BATCH_HEADER_BYTES // SIGN_BYTES
    signs, rest = (alive or [])[:room], (alive or [])[room:]
    size = SIGN_BYTES * len(signs)
    for meta, own in beats:
        grows = len(msgpack.packb(meta)) + 32 * len(own)
        if metas and (size + grows > BATCH_HEADER_BYTES or len(arrays) + len(own) > MAX_ARRAYS):
            yield {"beats": metas, "alive": signs}, arrays
            metas, arrays, size, signs = [], {}, 0, []
        arrays.update({f"{len(metas)}/{name}": array for name, array in own.items()})
        metas.append(meta)
        size += grows
    if metas or signs:
        yield {"beats": metas, "alive": signs}, arrays
    for start in range(0, len(rest), room):
        yield {"beats": [], "alive": rest[start:start + room]}, {}


def signs_of_life(message: Message) -> tuple[list[list[Any]], int]:
    """The signs of life of a `stats_batch`, each [worker, pid, since or None] (an older
    agent's [worker, pid] gains a None), and how many were malformed and left out
    (ValueError: 'alive' is no list). One pass, no call per sign: a controller takes
    thousands a second."""
    alive = message.meta.get("alive", []) if message.kind == "stats_batch" else []
    if not isinstance(alive, list):
        raise ValueError("stats_batch: 'alive' must be a list of signs of life")
    signs = [sign if len(sign) == 3 else [*sign, None] for sign in alive
             if type(sign) is list and 2 <= len(sign) <= 3 and type(sign[0]) is str
             and type(sign[1]) is int and (len(sign) == 2 or type(sign[2]) in SINCE_TYPES)]
    return signs, len(alive) - len(signs)


def unbatch(message: Message) -> list[Beat]:
    """The heartbeats of a `stats` or `stats_batch` message (ValueError: a malformed batch)."""
    if message.kind == "stats":
        return [(message.meta, message.arrays)]
    metas = message.meta.get("beats")
    if not isinstance(metas, list) or not all(isinstance(meta, dict) for meta in metas):
        raise ValueError("stats_batch: 'beats' must be a list of heartbeats")
    beats: list[Beat] = [(meta, {}) for meta in metas]
    for name, array in message.arrays.items():
        index, _, own = name.partition("/")
        if not index.isdigit() or int(index) >= len(beats) or not own:
            raise ValueError(f"stats_batch: array {name!r} belongs to no heartbeat")
        beats[int(index)][1][own] = array
    return beats


class HostAgent:
    """A host's agent, serving from threads of the process that makes it (a Ray actor,
    or a simulated host of `bench/swarm.py`): one serves the host, one the uplink."""

    def __init__(self, context: zmq.Context, upstream: str, keys: CurveKeys | None,
                 at: str, index: int = 0, fanout: int = RuntimeConfig.param_fanout,
                 bind_host: str = LOOPBACK) -> None:
        """`upstream`: the controller's name service. `at`: the base of the local
        addresses (`agent_address`). `index`: the agent's place in the parameter relays'
        trees (one per host, kept when the agent starts again); `fanout`: theirs
        (`runtime.param_fanout`); `bind_host`: where the relays serve other hosts.
        Returns once the agent serves: it has the run's config and a first copy of its
        names (waiting, with backoff, for a controller that does not answer yet)."""
        self.at = at
        self.host = pysocket.gethostname()
        self.rejects = RejectCounter()
        self.dropped = {"batches": 0, "logs": 0}
        """What the agent let go because the controller took nothing for a while."""
        self._context = context
        self._stopping = threading.Event()
        self._forwards: list[tuple[str, str, str | None]] = []
        self._forwards_lock = threading.Lock()
        self._wake_uplink = Wakeup()
        """Set for a register to pass on (a worker on another host waits for it) and to stop."""
        self._offered: list[Beat] = []
        self._offered_lock = threading.Lock()
        self.upstream = NetworkNameService(context, upstream, keys)
        config = self.upstream.run_config()
        local = Transport(context, bind_host, keys=keys)
        self.names = NameServer(local, config, forward=self._forward, at=at, own_thread=False)
        self.relays = Relays(local, self.names, lambda key, endpoint: self._forward(
            "unregister" if endpoint is None else "register", key, endpoint), at, index, fanout)
        self._stats_in = self._bind(local, STATS.bind_type, STATS.key())
        self._logs_in = self._bind(local, LOGS.bind_type, LOGS.key())
        self._stats_out = self._connect(STATS.connect_type, STATS.key(), keys)
        self._logs_out = self._connect(LOGS.connect_type, LOGS.key(), keys)
        self._changes = self._connect(CHANGES.connect_type, CHANGES.key(), keys)
        self._changes.setsockopt(zmq.SUBSCRIBE, b"")
        self._replicate(self.upstream.table())
        self.local = local
        self._threads = [threading.Thread(target=target, name=name, daemon=True)
                         for target, name in ((self._serve, "agent-serve"),
                                              (self._uplink, "agent-uplink"))]
        for thread in self._threads:
            thread.start()
        log.info("host agent for %s serving at %s (pid %d)", upstream, at, os.getpid())

    @property
    def endpoint(self) -> str:
        """Where this host's workers find their name service (`SRL_JAX_NAMES`)."""
        return self.names.endpoint

    def offer(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """A heartbeat from this process, as if it had come on the stats stream (the
        simulated workers of bench/swarm.py's `--simulate agents`)."""
        with self._offered_lock:
            self._offered.append((meta, arrays))

    def close(self) -> None:
        self._stopping.set()
        self._wake_uplink.set()
        self.names.wakeup.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self.relays.close()
        self.names.close()
        self.upstream.close()
        self.local.close()
        for socket in (self._stats_in, self._logs_in, self._stats_out, self._logs_out,
                       self._changes):
            socket.close(linger=0)
        self._wake_uplink.close()

    def _bind(self, local: Transport, kind: int | None, key: str) -> zmq.Socket:
        socket = make_socket(self._context, kind, hwm=QUEUE)
        local.bind(socket, self.names, key, fixed_endpoint(self.at, stream_of(key)))
        return socket

    def _connect(self, kind: int | None, key: str, keys: CurveKeys | None) -> zmq.Socket:
        socket = make_socket(self._context, kind, hwm=QUEUE)
        curve_connect(socket, self.upstream.lookup(key, self.upstream.patience_s), keys)
        return socket

    def _forward(self, op: str, key: str, endpoint: str | None) -> None:
        """A worker's register or unregister, for the uplink thread to pass on."""
        with self._forwards_lock:
            self._forwards.append((op, key, endpoint))
        self._wake_uplink.set()

    def _replicate(self, table: dict[str, str]) -> None:
        """Take a snapshot of the controller's names (its own streams' excepted: the agent
        stands for them), forgetting what the controller no longer has."""
        theirs = {key: endpoint for key, endpoint in table.items() if _replicated(key)}
        for key in set(self.names.table()) - set(theirs):
            if _replicated(key) and stream_of(key) is not PARAMS:
                self.names.register(key, None)
        self.relays.replace(theirs)
        for key, endpoint in theirs.items():
            if stream_of(key) is not PARAMS:
                self.names.register(key, endpoint)

    def _copy(self, key: str, endpoint: str | None) -> None:
        """A change of the controller's names, in the agent's copy and its relays. A
        policy's params key keeps the relay's local address, which the relay registers
        once the policy has a learner, and keeps while the learner is away."""
        if not self.relays.take(key, endpoint):
            self.names.register(key, endpoint)

    def _uplink(self) -> None:
        """Changes from the controller, a snapshot every SWEEP_S, registers passed on."""
        next_snapshot = time.monotonic() + SWEEP_S
        poller = zmq.Poller()
        poller.register(self._changes, zmq.POLLIN)
        poller.register(self._wake_uplink, zmq.POLLIN)
        while not self._stopping.is_set():
            if self._changes in dict(poller.poll(UPLINK_POLL_MS)):
                while (received := receive(self._changes, CHANGES.connecter_receives,
                                           self.rejects)) is not None:
                    if (change := change_of(received[1])) is not None and _replicated(change[0]):
                        self._copy(*change)
            self._wake_uplink.clear()
            with self._forwards_lock:
                forwards, self._forwards = self._forwards, []
            for op, key, endpoint in forwards:
                self._pass_on(op, key, endpoint)
            if time.monotonic() >= next_snapshot:
                next_snapshot = time.monotonic() + SWEEP_S
                try:
                    self._replicate(self.upstream.table())
                except (TimeoutError, ValueError) as error:
                    log.warning("no snapshot of the names: %s; serving the copy held", error)
                except zmq.ZMQError:  # closed while it waited for the snapshot: stopping
                    if not self._stopping.is_set():
                        raise
                    return

    def _pass_on(self, op: str, key: str, endpoint: str | None) -> None:
        try:
            if endpoint is not None:  # a register (an unregister comes without one)
                self.upstream.register(key, endpoint)
            else:
                self.upstream.unregister(key)
        except (TimeoutError, ValueError) as error:
            log.warning("%s of '%s' not passed on to the controller: %s", op, key, error)

    def _serve(self) -> None:
        """The host's side, from one thread: names answered, heartbeats batched, logs
        passed on; it wakes for what comes and for each batch, not on a clock."""
        held: list[Beat] = []
        next_batch = time.monotonic() + BATCH_S
        poller = zmq.Poller()
        for socket in (self.names.socket, self.names.wakeup, self._stats_in, self._logs_in):
            poller.register(socket, zmq.POLLIN)
        coalescer = Coalescer()
        beats: list[Beat] = []
        alive: list[list[Any]] = []
        while not self._stopping.is_set():
            wait = max(0.0, next_batch - time.monotonic())
            ready = dict(poller.poll(int(wait * 1000) + 1))  # not 0 ms: no spin at the end
            self.names.serve()
            now = time.monotonic()
            taken = self._take_offered()
            if self._stats_in in ready:
                while (received := receive(self._stats_in, STATS.binder_receives,
                                           self.rejects)) is not None:
                    taken += _beats_of(received[1], self.rejects)
            for meta, arrays in taken:
                if (whole := coalescer.take(meta, arrays, now)) is not None:
                    beats.append(whole)
                else:
                    alive.append(sign_of_life(meta))
            if self._logs_in in ready:
                self._pass_logs()
            if time.monotonic() >= next_batch:
                next_batch = time.monotonic() + BATCH_S
                held.extend(batches(beats, alive))
                beats, alive = [], []
                held = self._send_batches(held)
                coalescer.forget_old(time.monotonic())

    def _take_offered(self) -> list[Beat]:
        with self._offered_lock:
            offered, self._offered = self._offered, []
        return offered

    def _send_batches(self, held: list[Beat]) -> list[Beat]:
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
    """Whether the agent copies `key` from the controller (not the streams it stands
    for: STOOD_FOR)."""
    try:
        return stream_of(key) not in STOOD_FOR
    except KeyError:
        return False


def _beats_of(message: Message, rejects: RejectCounter) -> list[Beat]:
    try:
        return unbatch(message)
    except ValueError as error:
        rejects.reject(error)
        return []
