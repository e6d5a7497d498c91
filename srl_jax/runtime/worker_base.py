"""Worker base: lifecycle (setup, poll loop, close), heartbeats, clean shutdown.

Every worker kind (srl_jax/dataflow/worker_kinds.py: actor, inference server, ...) is a
subclass that implements `setup` and `run_once`, and reports counters. The base sends a
heartbeat carrying those counters to the controller every
`runtime.stats_interval_s`, stops on SIGTERM/SIGINT, and stops by itself when
its controller is gone, so a killed controller leaves no workers behind.

Run one with `python -m srl_jax.worker KIND INDEX --run-dir DIR [--policy P]`; the
controller does this for you. With `SRL_JAX_NAMES=<endpoint>` in its environment (the
controller's name service, srl_jax/runtime/name_server.py; `SRL_JAX_CURVE_KEYS` too where the
run uses CURVE) a worker reads nothing from a shared run directory: its config and
every endpoint come from the controller, its output goes to the controller's
`logs/<worker>.log` (srl_jax/runtime/log_stream.py), and DIR is a scratch directory of its
own host.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import resource
import select
import signal
import socket as pysocket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import zmq

from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig
from srl_jax.dataflow.fan_in import endpoint_host, server_order, servers_per_actor
from srl_jax.dataflow.stream_table import STATS, STREAMS, Stream
from srl_jax.dataflow.worker_kinds import KINDS, PARENT_ENV, PARENT_PIDFD_ENV, worker_kind
from srl_jax.runtime.faults import FaultPlan
from srl_jax.runtime.incarnation import Incarnation
from srl_jax.runtime.shm_attach import open_inbox, open_outbox, stream_slots
from srl_jax.wire.names import NameService, worker_name
from srl_jax.wire.peer_set import PeerSet
from srl_jax.wire.shm.layout import SlotLayout
from srl_jax.wire.stream_ends import Binder, Connecter
from srl_jax.wire.streams import RejectCounter, limit_message_size, make_socket, send
from srl_jax.wire.transport import Transport

LOOKUP_TIMEOUT_S = 120.0
EXIT_FAILED = 1
STACKS_SIGNAL = signal.SIGUSR1
"""A worker that gets it writes every thread's Python stack to its log."""
SET_UP = "set up in"
"""How the log line that says what a worker's start cost begins (bench/startup.py reads it:
a worker forked warm counts from its fork)."""
LAST_PHASE = "stopped"
"""The phase of the heartbeat a worker sends last, after `finish`, as it exits: the
controller waits for it before the run's last metrics row."""


class BusyBeats:
    """One helper thread that wakes every `interval` seconds and calls `beat` while a
    body (between `enter` and `exit`) has run for at least `interval` and less than
    `bound` seconds.

    `enter` and `exit` only set a field under a lock and wake nothing: a learner runs
    hundreds of millisecond-long bodies a second, and a wake-up for each cost it ~30 us
    of GIL hand-offs. A beat runs under the lock that `exit` takes, so none is in
    flight once `exit` returns: the main thread may use the sockets again.
    """

    def __init__(self, beat: Callable[[], None], interval: float, bound: float) -> None:
        self._beat = beat
        self._interval = interval
        self._bound = bound
        self._lock = threading.Lock()
        self._started: float | None = None
        """When the running body entered (monotonic); None between bodies."""
        threading.Thread(target=self._run, name="busy heartbeats", daemon=True).start()

    def enter(self) -> None:
        with self._lock:
            self._started = time.monotonic()

    def exit(self) -> None:
        with self._lock:
            self._started = None

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                if self._started is not None and \
                        self._interval <= time.monotonic() - self._started < self._bound:
                    self._beat()


def heartbeat_meta(name: str, kind: str, index: int, policy: str, phase: str,
                   counters: dict[str, float], ports: list[dict[str, Any]],
                   waiting: tuple[str, float] | None, pid: int | None = None) -> dict[str, Any]:
    """A heartbeat's metadata (the controller checks it: srl_jax/runtime/worker_records.py)."""
    return {"worker": name, "kind": kind, "index": index, "policy": policy,
            "pid": os.getpid() if pid is None else pid, "host": pysocket.gethostname(),
            "phase": phase, "counters": counters, "ports": ports,
            "waiting": list(waiting) if waiting else None}


def raise_open_files() -> None:
    """Raise this process's soft limit of open files to its hard limit: each connection
    is a descriptor, and soft limits are often 1,024 (the launcher checks the plan's
    sockets against the hard limit, `Plan.open_files_problem`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit may refuse
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def parent_watch(environ: Mapping[str, str]) -> Callable[[], bool]:
    """Whether the process that started this worker (the controller, a Ray node's agent) is gone: a
    worker forked by a warm parent polls its starter's pidfd, a started one compares its
    parent's pid with its starter's (a pid, unlike a pidfd, may name another process)."""
    pidfd = environ.get(PARENT_PIDFD_ENV)
    if pidfd is not None:
        poller = select.poll()
        poller.register(int(pidfd), select.POLLIN)
        return lambda: bool(poller.poll(0))
    parent = int(environ.get(PARENT_ENV, os.getppid()))
    return lambda: os.getppid() != parent


def built[T](part: T | None, what: str) -> T:
    """`part` of a worker, which its `setup` builds (RuntimeError where it has not)."""
    if part is None:
        raise RuntimeError(f"{what} is built by the worker's setup, which has not run")
    return part


def _check_same_host(stream: Stream) -> None:
    if not stream.same_host:
        raise ValueError(f"stream '{stream.name}' has no shared-memory transport: "
                         "open it with `Worker.socket`")


class WorkerStopped(Exception):
    """Raised out of a wait when the worker is told to stop."""


class Worker:
    """One process of the dataflow graph."""

    kind: ClassVar[str] = "worker"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        """`policy`: the policy a learner, inference server or evaluator serves."""
        self.config = config
        self.index = index
        self.policy = policy
        self.run_dir = Path(run_dir)
        self.names = names
        self.name = worker_name(self.kind, index, policy)
        self.log = logging.getLogger(self.name)
        self.zmq: zmq.Context = zmq.Context.instance()
        limit_message_size(self.zmq, config.runtime.max_message_mb)
        self.rejects = RejectCounter()
        self.transport = Transport.for_process(self.zmq, config.transport.bind_host,
                                               config.transport.advertise_host)
        self.incarnation = Incarnation.from_env(os.environ)
        """Which start of this worker this process is (the first when started by hand)."""
        self._stop = False
        self._followed: list[list[Any]] = []
        """[socket, key, endpoint] of each connection that follows its key (`connect_to`)."""
        self._peer_sets: list[PeerSet] = []
        """Its connecter sockets joined to a bounded set of binders (`socket`'s `peers`)."""
        self.peers_dropped: list[zmq.Socket] = []
        """Sockets of `_peer_sets` that lost (or let go) a binder since the worker last
        looked: their unanswered requests may be lost (`PeerSet.check`)."""
        self._ends: list[Connecter | Binder] = []
        """Its ends of same-host streams (`connect`, `bind`), for their counters."""
        same_host = [stream for stream in STREAMS if stream.same_host]
        self._shm_counter_names = (
            *(Binder.COUNTERS if any(s.binder == self.kind for s in same_host) else ()),
            *(Connecter.COUNTERS if any(self.kind in s.connecters for s in same_host) else ()))
        self._parent_gone = parent_watch(os.environ)
        self._last_stats = 0.0
        self._stats_socket: zmq.Socket | None = None
        self._phase = "setup"
        self._lookup_wait: tuple[str, float] | None = None
        self._busy: tuple[str, float] | None = None
        self._busy_beats: BusyBeats | None = None
        self._heartbeat_lock = threading.Lock()
        """Held while a heartbeat is sent: `busy` sends them from a helper thread."""
        self._progress = getattr(KINDS.get(self.kind), "progress", "")
        """The counter whose first rise sends a heartbeat at once (`WorkerKind.progress`);
        '' once it has risen."""

    def setup(self) -> None:
        """Bind and connect sockets, build environments or programs."""

    def run_once(self) -> None:
        """One turn of the poll loop; returns within about a stats interval."""
        raise NotImplementedError

    def counters(self) -> dict[str, float]:
        """Cumulative counters and current gauges sent with each heartbeat."""
        return {}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        """Arrays sent with a heartbeat (e.g. episodes finished since the last one)."""
        return {}

    def waiting(self) -> tuple[str, float] | None:
        """What this worker waits on (a stream or a key) and since when (wall time).

        Heartbeats carry it, so that the controller of a run that makes no
        progress, and `python -m srl_jax.runtime.status`, can say who waits on what.
        """
        return self._lookup_wait

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Heartbeat from a helper thread while the body blocks in slow device work
        (an XLA compile, a long update on a CPU), for up to `runtime.busy_timeout_s`.

        Slow work is not a hang, so the controller must not kill it; a body that
        outlasts the bound is left to `runtime.heartbeat_timeout_s` again, so a
        worker stuck for good is still killed. Heartbeats say `what` it is busy
        with. The body must not use the worker's sockets (JAX calls release the
        GIL, so the helper thread runs while they block). Cheap enough for every
        update: the helper thread is started once and wakes once a stats interval.
        """
        if self._busy_beats is None:
            self._busy_beats = BusyBeats(lambda: self.heartbeat(follow=False),
                                         self.config.runtime.stats_interval_s,
                                         self.config.runtime.busy_timeout_s)
        self._busy = (what, time.time())
        self._busy_beats.enter()
        try:
            yield
        finally:
            self._busy_beats.exit()
            self._busy = None

    def finish(self) -> None:
        """After a clean stop, before the last heartbeat (e.g. a final checkpoint)."""

    def close(self) -> None:
        """Release what `setup` took."""

    def lookup(self, key: str) -> str:
        """An endpoint from the name service, waiting while still heartbeating.

        Gives up with a line naming the key after LOOKUP_TIMEOUT_S, or as soon
        as the worker is told to stop or its controller is gone.
        """
        deadline = time.monotonic() + LOOKUP_TIMEOUT_S
        self._lookup_wait = (f"the name service key '{key}'", time.time())
        while True:
            try:
                endpoint = self.names.lookup(key, timeout_s=1.0)
                self._lookup_wait = None
                return endpoint
            except TimeoutError:
                self.heartbeat()
                if self._stop:
                    raise WorkerStopped(f"stopped while waiting for '{key}'") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no endpoint registered under '{key}' after "
                                       f"{LOOKUP_TIMEOUT_S:.0f}s") from None

    def socket(self, stream: Stream, policy: str | None = None, index: int | None = None,
               hwm: int | None = None, peers: int | None = None) -> zmq.Socket:
        """A socket on `stream`, bound or connected as its stream-table row says for this
        kind: the one place workers open streams (a same-host stream's whole end, socket
        and shared memory: `connect`, `bind`). The binder binds it and registers
        `stream.key(policy, index)` (by default its own index); a connecter connects it to
        that key and follows it, or on an indexed stream without `index` to every binder of
        the run (the binder kind's count), or with `peers` to that many of them (0: every
        one) in a `PeerSet`, which replaces a lost one (srl_jax/dataflow/fan_in.py).
        `policy`: by default this worker's; `hwm`: messages queued each way."""
        policy = self.policy if policy is None else policy
        binds = stream.binder == self.kind
        if not stream.is_zmq or not (binds or self.kind in stream.connecters):
            raise ValueError(f"a worker of kind '{self.kind}' opens no ZMQ socket on stream "
                             f"'{stream.name}' (srl_jax/dataflow/stream_table.py)")
        socket_type = stream.bind_type if binds else stream.connect_type
        socket = make_socket(self.zmq, socket_type, hwm=hwm, kernel_buffer=stream.kernel_buffer)
        if socket_type == zmq.SUB:  # every message of the stream
            socket.setsockopt(zmq.SUBSCRIBE, b"")
        if binds:
            own = self.index if stream.indexed and index is None else index
            self.transport.bind(socket, self.names, stream.key(policy, own))
            return socket
        if stream.connect_immediate:
            socket.setsockopt(zmq.IMMEDIATE, 1)
        every = stream.indexed and index is None
        # counted only where every binder is joined: a controller's stream has one binder,
        # and the controller is no worker kind
        count = worker_kind(stream.binder).count(self.config) if every else 1
        if every and peers is not None:
            self._join_peers(socket, [stream.key(policy, binder) for binder in range(count)],
                             servers_per_actor(peers, count))
            return socket
        for binder in range(count) if every else [index]:
            self.connect_to(socket, stream.key(policy, binder))
        return socket

    def _join_peers(self, socket: zmq.Socket, keys: list[str], bound: int) -> None:
        """Connect `socket` to `bound` of the binders under `keys`, its host's first
        (`server_order`); ZeroMQ's heartbeats find a silent one lost."""
        runtime = self.config.runtime
        socket.setsockopt(zmq.HEARTBEAT_IVL, int(runtime.stats_interval_s * 1000))
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(runtime.heartbeat_timeout_s * 1000))
        hosts = [endpoint_host(self.lookup(key)) for key in keys]
        order = server_order(self.index, self.transport.advertise_host, hosts)
        self._peer_sets.append(PeerSet(
            socket, [keys[i] for i in order], bound,
            connect=lambda key: self.connect_to(socket, key),
            disconnect=lambda key: self.disconnect_from(socket, key),
            keys_at=lambda: {endpoint: key for s, key, endpoint in self._followed
                             if s is socket}))

    def connect(self, stream: Stream, layout: SlotLayout, reply_layout: SlotLayout | None = None,
                policy: str | None = None, hwm: int | None = None,
                peers: int | None = None) -> Connecter:
        """This connecter's end of the same-host `stream`: its socket (`socket`, `peers` as
        there) and, where every binder shares its host, slots of `layout` (and on a request
        stream of `reply_layout`, what it is answered): srl_jax/runtime/shm_attach.py
        chooses."""
        _check_same_host(stream)
        policy = self.policy if policy is None else policy
        socket = self.socket(stream, policy, hwm=hwm, peers=peers)
        slots, split_slots = stream_slots(self.config, stream)
        (kind,) = stream.binder_receives
        end = Connecter(socket, kind, stream.connecter_receives, self.rejects,
                        open_outbox(self, stream, slots, layout, reply_layout, policy),
                        split_slots, f"{stream.name} stream's binders of policy '{policy}'",
                        self.log)
        self._ends.append(end)
        return end

    def bind(self, stream: Stream, layouts: Sequence[SlotLayout],
             hwm: int | None = None) -> Binder:
        """This binder's end of the same-host `stream` (of its own policy and index): its
        socket (`socket`) and, for connecters of its host, its doorbell and their slots of
        `layouts` (what they send, and on a request stream its answers), the doorbell
        registered before the socket so that a connecter that finds the socket finds it."""
        _check_same_host(stream)
        inbox = open_inbox(self, stream, list(layouts), stream_slots(self.config, stream)[0])
        socket = self.socket(stream, hwm=hwm)
        reply_kind = next(iter(stream.connecter_receives), "")
        end = Binder(socket, stream.binder_receives, self.rejects, inbox,
                     envelope=int(stream.bind_type == zmq.ROUTER), reply_kind=reply_kind,
                     copy=not reply_kind)
        self._ends.append(end)
        return end

    def shm_counters(self) -> dict[str, float]:
        """The shared-memory counters of its stream ends, summed (0 before they are open
        and where ZeroMQ carries them): a binder's, a connecter's, as its kind is either
        on a same-host stream."""
        totals = dict.fromkeys(self._shm_counter_names, 0.0)
        for end in self._ends:
            for name, value in end.counters().items():
                totals[name] += value
        return totals

    def connect_to(self, socket: zmq.Socket, key: str) -> None:
        """Connect `socket` to the endpoint under `key`, and follow the key: a peer
        restarted on another port or host registers anew, and `socket` moves with it."""
        endpoint = self.lookup(key)
        self.transport.connect(socket, endpoint)
        self._followed.append([socket, key, endpoint])

    def disconnect_from(self, socket: zmq.Socket, key: str) -> None:
        """Leave the binder under `key` that `socket` follows (`connect_to`)."""
        for entry in [entry for entry in self._followed if entry[0] is socket and entry[1] == key]:
            with contextlib.suppress(zmq.ZMQError):
                socket.disconnect(entry[2])
            self._followed.remove(entry)

    def _watch_peers(self) -> None:
        for peers in self._peer_sets:
            if not peers.check():
                continue
            self.log.info("lost or let go a binder: now joined to %s (lost: %s)",
                          ", ".join(peers.connected), ", ".join(sorted(peers.lost)) or "none")
            if peers.socket not in self.peers_dropped:
                self.peers_dropped.append(peers.socket)

    def _follow_endpoints(self) -> None:
        moved = self.names.moved({key: endpoint for _, key, endpoint in self._followed})
        for entry in self._followed:
            socket, key, endpoint = entry
            if key in moved and moved[key] != endpoint:
                with contextlib.suppress(zmq.ZMQError):
                    socket.disconnect(endpoint)
                self.transport.connect(socket, moved[key])
                entry[2] = moved[key]
                self.log.info("'%s' moved from %s to %s; reconnected", key, endpoint, moved[key])

    def _first_progress(self) -> bool:
        """Whether the kind's progress counter has just risen for the first time: the
        controller then hears of the first env frame within a turn, not a stats interval."""
        if not self._progress or not self.counters().get(self._progress, 0):
            return False
        self._progress = ""
        return True

    def keep_alive(self) -> bool:
        """For long waits: heartbeat, and say whether to keep waiting."""
        self.heartbeat()
        return not self._stop

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    @property
    def stopping(self) -> bool:
        return self._stop

    def heartbeat(self, force: bool = False, follow: bool = True) -> None:
        """Send counters to the controller if a stats interval has passed (and, with
        `follow`, reconnect to peers that moved)."""
        with self._heartbeat_lock:
            self._heartbeat(force, follow)

    def _heartbeat(self, force: bool, follow: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_stats < self.config.runtime.stats_interval_s:
            return
        self._last_stats = now
        if follow:
            self._follow_endpoints()
            self._watch_peers()
        if self._parent_gone():
            self.log.warning("the process that started it is gone; stopping")
            self._stop = True
        if self._stats_socket is None:
            return
        counters = {"wire_rejected": self.rejects.count, "auth_refused": self.transport.refused,
                    **self.counters()}
        meta = heartbeat_meta(self.name, self.kind, self.index, self.policy, self._phase,
                              counters, self.transport.port_list(), self._busy or self.waiting())
        try:  # poll first: a skipped heartbeat's episode returns wait for the next one
            if not self._stats_socket.poll(0, zmq.POLLOUT):
                raise zmq.Again
            send(self._stats_socket, "stats", meta, self.stats_arrays(), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.debug("stats stream full; heartbeat skipped")

    def connect_stats(self) -> None:
        """Connect the heartbeat stream to the controller, bounded by `runtime.stats_queue`."""
        self._stats_socket = make_socket(self.zmq, STATS.connect_type,
                                         hwm=self.config.runtime.stats_queue)
        self.transport.connect(self._stats_socket, self.names.lookup(STATS.key(), LOOKUP_TIMEOUT_S))
        self.heartbeat(force=True)

    def run(self) -> int:
        """The lifecycle: connect to the controller, setup, loop, close."""
        raise_open_files()
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        faulthandler.register(STACKS_SIGNAL, all_threads=True)  # into the log: runtime.status
        self.connect_stats()
        try:
            self.setup()
            self._phase = "running"
            self.log.info("%s %.2f CPU-s from its process's start", SET_UP, time.process_time())
            self.log.info("running")
            self.heartbeat(force=True)
            fault = FaultPlan(self.name)
            while not self._stop:
                self.run_once()
                self.heartbeat(force=self._first_progress())
                fault.check()
            self._phase = "finishing"
            self.finish()
            self._phase = LAST_PHASE
            self.heartbeat(force=True)
        except WorkerStopped as stopped:
            self.log.info("%s", stopped)
        finally:
            for peers in self._peer_sets:
                peers.close()
            self.close()
            if self._stats_socket is not None:
                self._stats_socket.close(linger=500)
            self.transport.close()
        self.log.info("stopped")
        return 0
