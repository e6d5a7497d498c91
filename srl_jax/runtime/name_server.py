"""The name service over the network: the controller serves it, workers ask it.

With the network name service (`runtime.names`: `network`, or `auto` on a cluster whose
hosts may share nothing) no worker reads the run directory. The controller's
`NameServer` keeps the names in memory and answers on the names stream, a ROUTER
bound through the run's transport (CURVE off loopback, listed in `status.json`'s
ports), from a thread of its own so that a slow controller turn delays no lookup.
Each worker's `NetworkNameService` asks it over a DEALER. A worker finds the server
through `SRL_JAX_NAMES` in its environment (its CURVE keys through
`SRL_JAX_CURVE_KEYS`), which the controller hands every worker it starts. The server
also hands out the run's resolved config, the one other thing a worker read from the
run directory.

Requests (`name_request`, all in meta; `id` an int the reply carries back):

    {"op": "register", "key", "endpoint"}     {"op": "unregister", "key"}
    {"op": "get", "key"}                      {"op": "lookup", "key", "wait_s"}
    {"op": "config"}

A reply (`name_reply`) is `{"id", "endpoint": str or None}`, `{"id", "error": str}` for
a request the server refuses, and for `config` the config's YAML as a uint8 array. A
lookup of a key not yet registered is held until the key is registered or `wait_s` (at
most MAX_WAIT_S) has passed, then answered with None; the client asks again until its
own timeout, as the file service polls. A request that is not the wire format is
counted and dropped; one that decodes but is wrong (unknown op, fields of the wrong
type, a key that is no worker's stream to register) is counted and refused.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from srl_jax.core.stream_table import NAMES, stream_of
from srl_jax.core.streams import NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.core.transport import CurveKeys, Transport, curve_connect
from srl_jax.core.wire import Message

NAMES_ENV = "SRL_JAX_NAMES"
"""The controller's name-service endpoint, in a worker's environment."""
MAX_WAIT_S = 5.0
"""Longest a lookup is held at the server; the client asks again."""
REQUEST_TIMEOUT_S = 10.0
"""How long a client waits for an answer, beyond the lookup's own wait."""
MAX_FIELD = 512
"""Longest key or endpoint, in characters."""
MAX_HELD = 4096
"""Lookups held at once; past it a lookup is answered at once (None: not yet)."""
MAX_REPLY_BYTES = 1 << 20
"""Largest reply a client takes (the config is a few kB)."""
POLL_MS = 20
OPS = frozenset({"register", "unregister", "get", "lookup", "config"})


@dataclass
class _Held:
    """A lookup waiting for its key."""

    routing: list[bytes]
    request_id: int
    key: str
    deadline: float


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
    """The run's names in the controller's memory, served on the names stream.

    The controller itself uses it in process, as a `NameService`.
    """

    def __init__(self, transport: Transport, run_config: str) -> None:
        """`run_config`: the resolved config's YAML, as the run directory has it."""
        self.rejects = RejectCounter()
        self._config = np.frombuffer(run_config.encode(), np.uint8)
        self._names: dict[str, str] = {}
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._socket = make_socket(transport.context, NAMES.bind_type)
        self.endpoint = transport.bind(self._socket, self, NAMES.key())
        self._thread = threading.Thread(target=self._serve, name="name-server", daemon=True)
        self._thread.start()

    def register(self, key: str, endpoint: str) -> None:
        with self._changed:
            self._names[key] = endpoint
            self._changed.notify_all()

    def unregister(self, key: str) -> None:
        with self._changed:
            self._names.pop(key, None)

    def get(self, key: str) -> str | None:
        with self._changed:
            return self._names.get(key)

    def lookup(self, key: str, timeout_s: float) -> str:
        with self._changed:
            if self._changed.wait_for(lambda: key in self._names, timeout_s):
                return self._names[key]
        raise TimeoutError(f"no endpoint registered under '{key}' after {timeout_s:.0f}s")

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2)

    def _serve(self) -> None:
        held: list[_Held] = []
        try:
            while not self._stopping.is_set():
                if self._socket.poll(POLL_MS):
                    while (received := receive(self._socket, NAMES.binder_receives,
                                               self.rejects, envelope=1)) is not None:
                        self._answer(*received, held)
                held[:] = [h for h in held if not self._answer_held(h)]
        finally:
            self._socket.close(linger=0)

    def _reply(self, routing: list[bytes], meta: dict[str, Any],
               arrays: dict[str, np.ndarray] | None = None) -> None:
        send(self._socket, "name_reply", meta, arrays, routing=routing)

    def _answer(self, routing: list[bytes], request: Message, held: list[_Held]) -> None:
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
        key = meta["key"]
        if op == "register":
            self.register(key, meta["endpoint"])
        elif op == "unregister":
            self.unregister(key)
        elif op == "lookup" and self.get(key) is None and len(held) < MAX_HELD:
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


class NetworkNameService:
    """A worker's `NameService`: each call is one request to the controller's `NameServer`."""

    def __init__(self, context: zmq.Context, endpoint: str, keys: CurveKeys | None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """`keys`: the run's CURVE keys (None: CURVE off), as the worker was given them."""
        self.endpoint = endpoint
        self.request_timeout_s = request_timeout_s
        self.rejects = RejectCounter()
        self._socket = make_socket(context, NAMES.connect_type)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        curve_connect(self._socket, endpoint, keys)
        self._last_id = 0
        self._lock = threading.Lock()
        """One request at a time (a worker's heartbeat thread may ask too)."""

    def register(self, key: str, endpoint: str) -> None:
        self._ask({"op": "register", "key": key, "endpoint": endpoint})

    def unregister(self, key: str) -> None:
        self._ask({"op": "unregister", "key": key})

    def get(self, key: str) -> str | None:
        return self._ask({"op": "get", "key": key}).meta["endpoint"]

    def lookup(self, key: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            wait = min(max(deadline - time.monotonic(), 0.0), MAX_WAIT_S)
            endpoint = self._ask({"op": "lookup", "key": key, "wait_s": wait}, wait).meta[
                "endpoint"]
            if endpoint is not None:
                return endpoint
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no endpoint registered under '{key}' after "
                                   f"{timeout_s:.0f}s")

    def run_config(self) -> str:
        """The run's resolved config (YAML), as the controller's run directory holds it."""
        config = self._ask({"op": "config"}).arrays.get("config")
        if config is None or config.dtype != np.uint8 or config.ndim != 1:
            raise ValueError(f"the name service at {self.endpoint} sent no config")
        return config.tobytes().decode()

    def close(self) -> None:
        self._socket.close(linger=0)

    def _ask(self, meta: dict[str, Any], wait_s: float = 0.0) -> Message:
        """Send one request and wait for its reply; replies to requests given up on
        earlier are skipped."""
        with self._lock:
            self._last_id += 1
            request_id = self._last_id
            limit = wait_s + self.request_timeout_s
            try:
                send(self._socket, "name_request", {**meta, "id": request_id}, flags=NOBLOCK)
            except zmq.Again:
                raise TimeoutError(f"the name service at {self.endpoint} takes no more "
                                   "requests") from None
            deadline = time.monotonic() + limit
            while self._socket.poll(int(max(deadline - time.monotonic(), 0.0) * 1000)):
                received = receive(self._socket, NAMES.connecter_receives, self.rejects)
                reply = received[1].meta if received else {}
                if reply.get("id") != request_id:
                    continue
                if isinstance(reply.get("error"), str):
                    raise ValueError(f"the name service refused {meta['op']} "
                                     f"{meta.get('key', '')!r}: {reply['error']}")
                if "endpoint" in reply and (reply["endpoint"] is None
                                            or isinstance(reply["endpoint"], str)):
                    return received[1]
                self.rejects.reject(ValueError("name reply: 'endpoint' is not a string"))
            raise TimeoutError(f"the name service at {self.endpoint} did not answer in "
                               f"{limit:.0f}s")
