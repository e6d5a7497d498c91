"""The name service over the network: the controller serves it, workers ask it.

With the network name service (`runtime.names`: `network`, or `auto` on a cluster whose
hosts may share nothing) no worker reads the run directory. The controller's
`NameServer` keeps the names in memory and answers on the names stream, a ROUTER
bound through the run's transport (CURVE off loopback, listed in `status.json`'s
ports), from a thread of its own so that a slow controller turn delays no lookup.
Each worker's `NetworkNameService` (srl_jax/runtime/name_client.py) asks it over a
DEALER. A worker finds the server through `SRL_JAX_NAMES` in its environment (its CURVE keys through
`SRL_JAX_CURVE_KEYS`), which the controller hands every worker it starts (or, with
host agents, its host's agent: srl_jax/runtime/hosts/host_agent.py). The server also hands
out the run's resolved config, the one other thing a worker read from the run
directory.

Requests (`name_request`, all in meta; `id` an int the reply carries back):

    {"op": "register", "key", "endpoint"}     {"op": "unregister", "key"}
    {"op": "get", "key"}                      {"op": "lookup", "key", "wait_s"}
    {"op": "config"}                          {"op": "names", "keys" (optional)}

A reply (`name_reply`) is `{"id", "endpoint": str or None}`, `{"id", "error": str}` for
a request the server refuses, for `config` the config's YAML as a uint8 array, and for
`names` also `"names": {key: endpoint}` (those of `keys` that are registered; without
`keys`, the whole table). A lookup of a key not yet registered is held until the key is
registered or `wait_s` (at most MAX_WAIT_S) has passed, then answered with None; the
client asks again until its own timeout, as the file service waits. With MAX_HELD lookups
held, one more is answered at once with None and `"full": true`: the client then waits
before it asks again, longer each time, with jitter (name_client.py's BACKOFF_S), so
that thousands of workers starting at once do not ask in a tight loop. A key registered in
process (the controller's own streams, a host agent's copy of the controller's change)
wakes the serving loop (`Wakeup`): its held lookups are answered, and the change
published, at once, not at the loop's next turn. A request that is not the wire format
is counted and dropped; one that decodes but is wrong (unknown op, fields of the wrong
type, a key that is no worker's stream to register) is counted and refused.

Followers are told, not asked: every change of the table goes out at once on the
changes stream (`name_change`, meta `{"key", "endpoint": str or None}`), a PUB that a
worker's `NetworkNameService` subscribes to when it first follows a key. So a worker's
heartbeat asks nothing: `moved` reads the changes that came. A change missed (one made
while the subscription was still on its way) is caught by a sweep, one `names` request
for every followed key, SWEEP_FIRST_S after the first follow and every SWEEP_S after;
one not answered is dropped and tried again later, with backoff. The name service can
stall or restart without stopping a worker: a worker keeps the endpoints it has, and a
request that must be answered (register, config) is asked again with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from srl_jax.dataflow.stream_table import CHANGES, NAMES, Stream, stream_of
from srl_jax.runtime.name_client import CHANGES_QUEUE, MAX_KEYS, MAX_WAIT_S
from srl_jax.wire.codec import Message
from srl_jax.wire.names import moved_by_get
from srl_jax.wire.streams import NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import Transport

log = logging.getLogger(__name__)

NAMES_ENV = "SRL_JAX_NAMES"
"""The controller's name-service endpoint, in a worker's environment."""
MAX_FIELD = 512
"""Longest key or endpoint, in characters."""
MAX_HELD = 4096
"""Lookups held at once; past it a lookup is answered at once (None, and `full`)."""
POLL_MS = 20
OPS = frozenset({"register", "unregister", "get", "lookup", "config", "names"})


class Wakeup:
    """Wakes a loop blocked in a poll from another thread: a pipe whose read end a
    `zmq.Poller` (or `select`) waits on beside its sockets. Setting it twice before the
    loop clears it wakes it once."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        """Held while writing and closing: a set after `close` writes to no reused fd."""

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        with self._lock, contextlib.suppress(BlockingIOError):  # a full pipe is set
            if self._write >= 0:
                os.write(self._write, b"\0")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 1 << 16)

    def close(self) -> None:
        with self._lock:
            if self._write >= 0:
                os.close(self._read)
                os.close(self._write)
                self._read = self._write = -1


@dataclass
class _Held:
    """A lookup waiting for its key."""

    routing: list[bytes]
    request_id: int
    key: str
    deadline: float


def fixed_endpoint(at: str, stream: Stream) -> str:
    """Where a service with fixed addresses based `at` (a host agent) binds `stream`."""
    return f"{at}-{stream.name}"


def _field(meta: dict[str, Any], name: str) -> str:
    value = meta.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_FIELD:
        raise ValueError(f"'{name}' must be a string of 1 to {MAX_FIELD} characters")
    return value


def _check_request(meta: dict[str, Any]) -> str:
    """The request's op, once its fields are what the op needs (ValueError otherwise)."""
    op = meta.get("op")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    if op == "config":
        return op
    if op == "names":
        keys = meta.get("keys", [])
        if not isinstance(keys, list) or len(keys) > MAX_KEYS or not all(
                isinstance(key, str) and 0 < len(key) <= MAX_FIELD for key in keys):
            raise ValueError(f"'keys' must be a list of at most {MAX_KEYS} keys")
        return op
    key = _field(meta, "key")
    if op == "register":
        _field(meta, "endpoint")
    if op in ("register", "unregister"):
        try:
            stream = stream_of(key)
        except KeyError:
            raise ValueError(f"'{key}' is no stream's key") from None
        if stream.binder == "controller":
            raise ValueError(f"'{key}' is the controller's own")
    wait = meta.get("wait_s")
    if op == "lookup" and (not isinstance(wait, int | float) or isinstance(wait, bool)
                           or not 0 <= wait <= 3600):
        raise ValueError("'wait_s' must be a number of seconds")
    return op


class NameServer:
    """The run's names in the controller's memory, served on the names stream, each change
    pushed on the changes stream.

    The controller itself uses it in process, as a `NameService`. A host agent serves its
    host from one too, as a replica of the controller's (`forward`: where a worker's
    register or unregister goes on to, besides this table).
    """

    def __init__(self, transport: Transport, run_config: str,
                 forward: Callable[[str, str, str | None], None] | None = None,
                 at: str | None = None, own_thread: bool = True) -> None:
        """`run_config`: the resolved config's YAML, as the run directory has it.
        `forward(op, key, endpoint)`: called from the serving thread with each register
        and unregister a client asks for (None: this is the run's own table). `at`: bind
        `<at>-names` and `<at>-changes` (None: ports the transport picks). `own_thread`:
        serve from a thread of its own; False: its owner polls `socket` and calls `serve`
        in its own loop (waking for `wakeup` too), and `close` from there."""
        self.rejects = RejectCounter()
        self.requests = 0
        """Requests answered or held so far (`system/name_requests`)."""
        self._config = np.frombuffer(run_config.encode(), np.uint8)
        self._forward = forward
        self._names: dict[str, str] = {}
        self._unsent: list[tuple[str, str | None]] = []
        """Changes not yet published (only the serving thread touches the sockets)."""
        self._changed = threading.Condition()
        self.wakeup = Wakeup()
        """Set by each change, and to stop: the serving loop acts on it at once."""
        self._stopping = threading.Event()
        self._changes = make_socket(transport.context, CHANGES.bind_type, hwm=CHANGES_QUEUE)
        self._socket = make_socket(transport.context, NAMES.bind_type)
        self.changes_endpoint = transport.bind(self._changes, self, CHANGES.key(),
                                               at and fixed_endpoint(at, CHANGES))
        self.endpoint = transport.bind(self._socket, self, NAMES.key(),
                                       at and fixed_endpoint(at, NAMES))
        self._held: list[_Held] = []
        self._thread = threading.Thread(target=self._serve, name="name-server", daemon=True)
        if own_thread:
            self._thread.start()

    @property
    def socket(self) -> zmq.Socket:
        """The names stream's socket, for an owner that serves from its own loop."""
        return self._socket

    def register(self, key: str, endpoint: str | None) -> None:
        """Set `key` (None: forget it), and tell followers."""
        with self._changed:
            if self._names.get(key) == endpoint:
                return
            if endpoint is None:
                self._names.pop(key, None)
            else:
                self._names[key] = endpoint
            self._unsent.append((key, endpoint))
            self._changed.notify_all()
        self.wakeup.set()

    def unregister(self, key: str) -> None:
        self.register(key, None)

    def get(self, key: str) -> str | None:
        with self._changed:
            return self._names.get(key)

    def table(self, keys: list[str] | None = None) -> dict[str, str]:
        """The registered names (of `keys`; all of them without)."""
        with self._changed:
            if keys is None:
                return dict(self._names)
            return {key: self._names[key] for key in keys if key in self._names}

    def lookup(self, key: str, timeout_s: float) -> str:
        with self._changed:
            if self._changed.wait_for(lambda: key in self._names, timeout_s):
                return self._names[key]
        raise TimeoutError(f"no endpoint registered under '{key}' after {timeout_s:.0f}s")

    def moved(self, followed: Mapping[str, str]) -> dict[str, str]:
        return moved_by_get(self, followed)

    def close(self) -> None:
        self._stopping.set()
        self.wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        else:
            self._close_sockets()

    def serve(self) -> None:
        """Answer what has come, publish the changes made, answer held lookups whose key
        came or whose wait is over."""
        self.wakeup.clear()
        while (received := receive(self._socket, NAMES.binder_receives, self.rejects,
                                   envelope=1)) is not None:
            self._answer(*received, self._held)
        self._publish()
        self._held[:] = [h for h in self._held if not self._answer_held(h)]

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self.wakeup, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                poller.poll(POLL_MS)
                self.serve()
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        self._socket.close(linger=0)
        self._changes.close(linger=0)
        self.wakeup.close()

    def _publish(self) -> None:
        with self._changed:
            unsent, self._unsent = self._unsent, []
        for key, endpoint in unsent:  # a PUB never blocks: a follower behind loses changes
            send(self._changes, "name_change", {"key": key, "endpoint": endpoint},
                 flags=NOBLOCK)

    def _reply(self, routing: list[bytes], meta: dict[str, Any],
               arrays: dict[str, np.ndarray] | None = None) -> None:
        send(self._socket, "name_reply", meta, arrays, routing=routing)

    def _answer(self, routing: list[bytes], request: Message, held: list[_Held]) -> None:
        self.requests += 1
        meta = request.meta
        request_id = meta.get("id") if type(meta.get("id")) is int else None
        try:
            if request_id is None:
                raise ValueError("'id' must be an int")
            op = _check_request(meta)
        except ValueError as error:
            self.rejects.reject(ValueError(f"name request refused: {error}"))
            self._reply(routing, {"id": request_id, "error": str(error)})
            return
        if op == "config":
            self._reply(routing, {"id": request_id, "endpoint": None}, {"config": self._config})
            return
        if op == "names":
            self._reply(routing, {"id": request_id, "endpoint": None,
                                  "names": self.table(meta.get("keys"))})
            return
        key = meta["key"]
        if op in ("register", "unregister"):
            endpoint = meta["endpoint"] if op == "register" else None
            self.register(key, endpoint)
            if self._forward is not None:
                self._forward(op, key, endpoint)
        elif op == "lookup" and self.get(key) is None:
            if len(held) >= MAX_HELD:
                self._reply(routing, {"id": request_id, "endpoint": None, "full": True})
                return
            held.append(_Held(routing, request_id, key,
                              time.monotonic() + min(meta["wait_s"], MAX_WAIT_S)))
            return
        self._reply(routing, {"id": request_id,
                              "endpoint": self.get(key) if op in ("get", "lookup") else None})

    def _answer_held(self, held: _Held) -> bool:
        """Answer a held lookup if its key has come or its wait is over."""
        endpoint = self.get(held.key)
        if endpoint is None and time.monotonic() < held.deadline:
            return False
        self._reply(held.routing, {"id": held.request_id, "endpoint": endpoint})
        return True
