"""Parameter relays: each version leaves the learner at most `runtime.param_fanout` times,
whatever the number of subscribers.

Without relays the learner's PUB sends every version once per subscriber: a 6.7 MB
Nature-CNN to 1,000 inference servers is 6.7 GB per version, from one process. With
host agents (srl_jax/runtime/hosts/host_agent.py) each agent runs one relay per policy, and
its host's workers subscribe to that relay: the agent answers a policy's params key with
the relay's local address. A policy's relays form a tree of fan-out k: ordered by their
agents' indices, the first k take the learner's stream, and the relay of rank r >= k
takes that of rank r // k - 1 (`parent_rank`). So the learner sends each version k
times, a relay at most k times to other hosts and once per subscriber on its own, and a
version reaches every host after about log_k(hosts) hops.

A relay sends each message on as it came (the same frames, no copy): versions and
learner start times, and so every lag and staleness figure, are the learner's. It keeps the
newest and sends it again when a subscriber joins (at most every RESEND_S), so that a
restarted worker, or a relay that attached again, need not wait for the learner's
republish.

Each relay tells the relays below it, every NOTE_S, the newest version it holds and the
newest its own parent said it holds (`relay_note`). A relay whose parent relay is
silent for SILENT_S (not reachable, or connected but sending neither versions nor notes:
its host frozen, its thread stuck), or whose parent's newest lags that parent's own
parent's for SILENT_S (a connected parent that takes no versions), leaves it out (for
DOWN_S, or until the parent registers anew) and takes the stream from the next relay
up, the learner at the top. A silent parent has left: the child also unregisters its
relay key (through its agent, at the controller), so that no relay ranks it again; the
children see each dead node, on every backend, where the controller or Ray would see
only their own kind of loss. A relay alive after all (a child's network, not the
parent, failed) finds its key gone from the names and registers it again. A parent
always has a lower index than its child, so the tree has no cycle, however the relays'
views of it differ for a while. An agent started again binds its relay's port again,
and the relays below it reconnect by themselves.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import recv_monitor_message

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.stream_table import PARAMS, RELAY, Stream, stream_of
from srl_jax.runtime.name_server import NameServer
from srl_jax.wire.codec import Message
from srl_jax.wire.streams import (
    NOBLOCK,
    RejectCounter,
    make_socket,
    receive_frames,
    send,
    send_frames,
)
from srl_jax.wire.transport import Transport

log = logging.getLogger("param_relay")

RESEND_S = 1.0
"""The newest version goes again to a relay's subscribers at most this often when new
ones join."""
SILENT_S = 10.0
"""A parent relay silent this long (no version, no note; Ray starts a killed agent again
within seconds), or lagging its own parent this long, is left out of the tree; a relay
whose key is missing from the names this long after it registered registers again."""
DOWN_S = 30.0
"""How long a parent left out stays out, unless it registers anew."""
NOTE_S = 1.0
"""How often a relay notes its newest version to the relays below it (a few bytes)."""
POLL_MS = 1000
"""The longest the relays' thread sleeps with nothing to do: a change of the names (a new
parent) is taken within this. One wake a second per host costs nothing; 100 agents
sharing 2 cores in bench/swarm.py's simulated cluster felt five."""
QUEUE = 4
"""Versions queued per subscriber (ZMQ high-water mark): only the newest matters."""
JOINED = 1
"""First byte of the message an XPUB gets when a subscriber joins."""


def parent_rank(rank: int, fanout: int) -> int | None:
    """The rank of relay `rank`'s parent in a tree of fan-out `fanout` (None: the learner)."""
    return None if rank < fanout else rank // fanout - 1


def upstream_of(own: int, relays: Mapping[int, str], root: str, fanout: int) -> str:
    """Where the relay of agent `own` takes its parameters from: its parent among
    `relays` (agent index: endpoint) and itself, ranked by index; `root`, the
    learner's endpoint, for the first `fanout`."""
    ranks = sorted({*relays, own})
    parent = parent_rank(ranks.index(own), fanout)
    return root if parent is None else relays[ranks[parent]]


def relay_address(at: str, policy: str) -> str:
    """Where an agent's relay of `policy` serves its own host (`at`: the agent's base)."""
    return f"{at}-{PARAMS.name}" if policy == DEFAULT_POLICY else f"{at}-{PARAMS.name}-{policy}"


@dataclass
class PolicyView:
    """What the names say about one policy's parameters."""

    root: str | None = None
    """The learner's endpoint."""
    relays: dict[int, str] = field(default_factory=dict)
    """Each relay's endpoint, by agent index."""


def views_of(table: Mapping[str, str]) -> dict[str, PolicyView]:
    """Each policy's view, from a table of names."""
    views: dict[str, PolicyView] = {}
    for key, endpoint in table.items():
        _take(views, key, endpoint)
    return views


def _take(views: dict[str, PolicyView], key: str, endpoint: str | None) -> Stream | None:
    """Note `key`'s endpoint (None: gone) in `views` if it is a learner's or a relay's;
    its stream if it was."""
    try:
        stream = stream_of(key)
    except KeyError:
        return None
    if stream not in (PARAMS, RELAY):
        return None
    policy, _, bare = key.rpartition("/")
    view = views.setdefault(policy or DEFAULT_POLICY, PolicyView())
    if stream is PARAMS:
        view.root = endpoint
    elif endpoint is None:
        view.relays.pop(int(bare.rsplit(".", 1)[1]), None)
    else:
        view.relays[int(bare.rsplit(".", 1)[1])] = endpoint
    return stream


class ParamRelay:
    """One policy's relay on one host: a SUB from its parent, an XPUB to its host's
    subscribers and one to the relays below it."""

    def __init__(self, context: zmq.Context, transport: Transport, names: NameServer,
                 policy: str, index: int, at: str, rejects: RejectCounter) -> None:
        self.policy = policy
        self.rejects = rejects
        self.forwarded = 0
        """Messages sent on (each version once, whatever the subscribers)."""
        self._transport = transport
        self.local = self._publisher(context)
        transport.bind(self.local, names, PARAMS.key(policy), relay_address(at, policy))
        self.children = self._publisher(context)
        self.endpoint = transport.bind(self.children, names, RELAY.key(policy, index))
        self.upstream = make_socket(context, zmq.SUB, hwm=QUEUE)
        self.upstream.setsockopt(zmq.SUBSCRIBE, b"")
        self.monitor = self.upstream.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.target: str | None = None
        self.connected = False
        self.heard_at = self.registered_at = time.monotonic()
        """When the parent last sent anything (or was connected to); when this relay last
        registered its key."""
        self.lagging_since: float | None = None
        """Since when the parent's notes say it lags its own parent (None: it does not)."""
        self._newest: tuple[tuple[int, int], list[zmq.Frame]] | None = None
        self._above: tuple[int, int] | None = None
        """The newest the parent noted holding (None: no note; the learner sends none)."""
        self._noted = 0.0
        self._resent = {self.local: 0.0, self.children: 0.0}
        self._joined = {self.local: False, self.children: False}

    @staticmethod
    def _publisher(context: zmq.Context) -> zmq.Socket:
        socket = make_socket(context, zmq.XPUB, hwm=QUEUE)
        socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # every join, not only the first
        return socket

    @property
    def sockets(self) -> tuple[zmq.Socket, ...]:
        return self.upstream, self.local, self.children, self.monitor

    def retarget(self, endpoint: str) -> None:
        """Take the stream from `endpoint` from now on."""
        if endpoint == self.target:
            return
        if self.target is not None:
            with contextlib.suppress(zmq.ZMQError):  # never connected
                self.upstream.disconnect(self.target)
        self._transport.connect(self.upstream, endpoint)
        log.info("relay of policy %s takes parameters from %s (was %s)", self.policy,
                 endpoint, self.target)
        self.target, self.connected = endpoint, False
        self.heard_at, self.lagging_since, self._above = time.monotonic(), None, None

    def silent_for(self, now: float) -> float:
        """Seconds since the parent last sent anything (or was connected to)."""
        return now - self.heard_at

    def lagging_for(self, now: float) -> float:
        """Seconds the parent's notes have said that its newest lags its own parent's."""
        return 0.0 if self.lagging_since is None else now - self.lagging_since

    def pump(self, now: float) -> None:
        """Send on what came from the parent; the newest again where subscribers joined;
        a note to the relays below every NOTE_S."""
        while (received := receive_frames(self.upstream, RELAY.connecter_receives,
                                          self.rejects)) is not None:
            frames, message = received
            self.heard_at = now
            if message.kind == "relay_note":
                self._take_note(message, now)
                continue
            order = _order(message)
            if order is None:
                self.rejects.reject(ValueError("params without an integer version/started_ms"))
                continue
            for socket in (self.local, self.children):
                send_frames(socket, frames, NOBLOCK)
            self.forwarded += 1
            if self._newest is None or order >= self._newest[0]:
                self._newest = order, frames
        for socket in (self.local, self.children):
            while socket.poll(0):
                self._joined[socket] |= socket.recv()[:1] == bytes([JOINED])
            if self._joined[socket] and self._newest is not None \
                    and now - self._resent[socket] >= RESEND_S:
                send_frames(socket, self._newest[1], NOBLOCK)
                self._joined[socket], self._resent[socket] = False, now
        if now - self._noted >= NOTE_S:
            send(self.children, "relay_note", {"newest": self._newest and list(self._newest[0]),
                                               "above": self._above and list(self._above)},
                 flags=NOBLOCK)
            self._noted = now
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["endpoint"].decode() != self.target:
                continue
            self.connected = event["event"] == zmq.EVENT_CONNECTED
            if self.connected:
                self.heard_at = now

    def _take_note(self, message: Message, now: float) -> None:
        """The parent's newest and its own parent's: whether it lags, and since when."""
        try:
            newest, above = (_noted(message.meta.get(name)) for name in ("newest", "above"))
        except ValueError as error:
            self.rejects.reject(error)
            return
        self._above = newest
        lags = above is not None and (newest is None or newest < above)
        self.lagging_since = (self.lagging_since or now) if lags else None

    def close(self) -> None:
        self.upstream.disable_monitor()
        for socket in self.sockets:
            socket.close(linger=0)


def _order(message: Message) -> tuple[int, int] | None:
    version, started_ms = message.meta.get("version"), message.meta.get("started_ms", 0)
    if type(version) is not int or type(started_ms) is not int:
        return None
    return started_ms, version


def _noted(value: object) -> tuple[int, int] | None:
    """A note's [started_ms, version] as an order (None: none noted)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or not all(type(v) is int for v in value):
        raise ValueError("relay_note: 'newest' and 'above' must be [started_ms, version] or None")
    return value[0], value[1]


class Relays:
    """A host agent's relays, one per policy whose learner the names list, served from a
    thread of their own; the agent tells them each change of the names."""

    def __init__(self, transport: Transport, names: NameServer,
                 register_upstream: Callable[[str, str | None], None], at: str, index: int,
                 fanout: int) -> None:
        """`names`: the agent's table, where each relay registers the policy's params key
        (its local address) and its relay key; `register_upstream(key, endpoint)` passes
        a relay key on to the controller (endpoint None: unregisters it, a parent's that
        left). `index`: the agent's place in the trees."""
        self.rejects = RejectCounter()
        self._transport = transport
        self._names = names
        self._register_upstream = register_upstream
        self._at, self._index, self._fanout = at, index, fanout
        self._views: dict[str, PolicyView] = {}
        self._changed = True
        self._lock = threading.Lock()
        self._down: dict[tuple[str, int], tuple[float, str]] = {}
        """Parents left out: (policy, index) -> (since, the endpoint that was unreachable)."""
        self.relays: dict[str, ParamRelay] = {}
        self._poller = zmq.Poller()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="agent-relays", daemon=True)
        self._thread.start()

    def take(self, key: str, endpoint: str | None) -> bool:
        """Note a change of `key`; True where it is a learner's params key, which the
        agent's table keeps for the relay's local address."""
        with self._lock:
            stream = _take(self._views, key, endpoint)
            self._changed |= stream is not None
        return stream is PARAMS

    def replace(self, table: Mapping[str, str]) -> None:
        """Take a whole snapshot of the names."""
        with self._lock:
            self._views, self._changed = views_of(table), True

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2)

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                self._turn()
        finally:
            for relay in self.relays.values():
                relay.close()

    def _turn(self) -> None:
        now = time.monotonic()
        changed = self._left_out(now)
        self._keep_registered(now)
        with self._lock:
            if self._changed or changed:
                views, self._changed = {p: PolicyView(v.root, dict(v.relays))
                                        for p, v in self._views.items()}, False
            else:
                views = None
        if views is not None:
            self._follow(views)
        if not self.relays:
            self._stopping.wait(POLL_MS / 1000)
            return
        self._poller.poll(POLL_MS)
        for relay in self.relays.values():
            relay.pump(time.monotonic())

    def _follow(self, views: dict[str, PolicyView]) -> None:
        """Start the relay of each policy that has a learner; point each at its parent."""
        for policy, view in views.items():
            if view.root is None:
                continue
            relay = self.relays.get(policy)
            if relay is None:
                relay = self.relays[policy] = ParamRelay(
                    self._transport.context, self._transport, self._names, policy,
                    self._index, self._at, self.rejects)
                for socket in relay.sockets:
                    self._poller.register(socket, zmq.POLLIN)
                self._register_upstream(RELAY.key(policy, self._index), relay.endpoint)
            live = {index: endpoint for index, endpoint in view.relays.items()
                    if not self._is_down(policy, index, endpoint)}
            relay.retarget(upstream_of(self._index, live, view.root, self._fanout))

    def _is_down(self, policy: str, index: int, endpoint: str) -> bool:
        """Whether a parent is left out; one registered anew (another endpoint) is back."""
        down = self._down.get((policy, index))
        if down is not None and endpoint != down[1]:
            del self._down[(policy, index)]
            return False
        return down is not None

    def _left_out(self, now: float) -> bool:
        """Leave out each parent relay silent, or lagging its own parent, for SILENT_S,
        and unregister a silent one's key; whether any was left out, or any left out may
        come back (DOWN_S passed)."""
        expired = [key for key, (since, _) in self._down.items() if now - since > DOWN_S]
        for key in expired:
            del self._down[key]
        changed = bool(expired)
        for policy, relay in self.relays.items():
            silent = relay.silent_for(now) >= SILENT_S
            if relay.target is None or not (silent or relay.lagging_for(now) >= SILENT_S):
                continue
            with self._lock:
                view = self._views.get(policy, PolicyView())
                parent = next((index for index, endpoint in view.relays.items()
                               if endpoint == relay.target and index != self._index), None)
            if parent is not None and (policy, parent) not in self._down:
                log.warning("relay of policy %s: its parent (agent %d at %s) %s for %.1f s; "
                            "taking the stream from above it", policy, parent, relay.target,
                            "silent" if silent else "behind its own parent",
                            relay.silent_for(now) if silent else relay.lagging_for(now))
                self._down[(policy, parent)] = now, relay.target
                if silent:
                    self._register_upstream(RELAY.key(policy, parent), None)
                changed = True
        return changed

    def _keep_registered(self, now: float) -> None:
        """Register again each relay key missing from the names SILENT_S after it was
        registered (a child that took this relay for gone unregistered it)."""
        for policy, relay in self.relays.items():
            if now - relay.registered_at < SILENT_S:
                continue
            with self._lock:
                listed = self._views.get(policy, PolicyView()).relays.get(self._index)
            if listed != relay.endpoint:
                log.warning("relay of policy %s: its key is not in the names; registering "
                            "it again", policy)
                self._register_upstream(RELAY.key(policy, self._index), relay.endpoint)
                relay.registered_at = now
