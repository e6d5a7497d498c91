"""A worker's side of the network name service (the protocol: srl_jax/runtime/name_server.py).

`NetworkNameService` asks the controller's `NameServer`, or its host's agent, over a
DEALER, and follows the keys it connected to through the changes stream: its `moved`
asks nothing, and a sweep now and then catches a change it missed. The name service can
stall or restart without stopping a worker: requests that must be answered are asked
again with backoff.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from srl_jax.dataflow.stream_table import CHANGES, NAMES
from srl_jax.wire.codec import Message
from srl_jax.wire.streams import NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import CurveKeys, curve_connect

log = logging.getLogger(__name__)

MAX_WAIT_S = 5.0
"""Longest a lookup is held at the server; the client asks again."""
REQUEST_TIMEOUT_S = 10.0
"""How long a client waits for an answer, beyond the lookup's own wait."""
PATIENCE_S = 120.0
"""How long a client asks again, with backoff, for a request that must be answered."""
BACKOFF_S = (0.5, 8.0)
"""First and longest pause between tries of a request not answered, and of a lookup
that a server holding all it can (`full`) answered at once."""
SWEEP_FIRST_S = 2.0
"""The first sweep of the followed keys, after the first follow."""
SWEEP_S = 30.0
"""Between sweeps (with a tenth of jitter, so that thousands of workers spread out)."""
MAX_KEYS = 4096
"""Most keys one `names` request asks for."""
MAX_REPLY_BYTES = 1 << 20
"""Largest reply a client takes (the config is a few kB)."""
CHANGES_QUEUE = 10_000
"""Changes queued towards each follower (ZMQ high-water mark); a sweep catches what is lost."""


def change_of(message: Message) -> tuple[str, str | None] | None:
    """(key, endpoint or None) of a `name_change`, or None where it is not one."""
    key, endpoint = message.meta.get("key"), message.meta.get("endpoint")
    if not isinstance(key, str) or not (endpoint is None or isinstance(endpoint, str)):
        return None
    return key, endpoint


class NetworkNameService:
    """A worker's `NameService`: requests to the controller's `NameServer` (or its host
    agent's), and the changes it pushes."""

    def __init__(self, context: zmq.Context, endpoint: str, keys: CurveKeys | None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 patience_s: float = PATIENCE_S) -> None:
        """`keys`: the run's CURVE keys (None: CURVE off), as the worker was given them.
        `patience_s`: how long a register, unregister, get or config request is asked
        again while the server does not answer."""
        self.endpoint = endpoint
        self.request_timeout_s = request_timeout_s
        self.patience_s = patience_s
        self.rejects = RejectCounter()
        self._context, self._keys = context, keys
        self._socket = make_socket(context, NAMES.connect_type)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        curve_connect(self._socket, endpoint, keys)
        self._changes: zmq.Socket | None = None
        self._sweep_at = self._sweep_sent = 0.0
        self._sweep_id: int | None = None
        self._sweep_reply: Message | None = None
        """The sweep's answer, where a request asked meanwhile took it off the socket."""
        self._sweep_backoff = SWEEP_S
        self._last_id = 0
        self._lock = threading.Lock()
        """One request at a time (a worker's heartbeat thread may ask too)."""

    def register(self, key: str, endpoint: str) -> None:
        self._ask_patiently({"op": "register", "key": key, "endpoint": endpoint})

    def unregister(self, key: str) -> None:
        self._ask_patiently({"op": "unregister", "key": key})

    def get(self, key: str) -> str | None:
        return self._ask_patiently({"op": "get", "key": key}).meta["endpoint"]

    def table(self, keys: list[str] | None = None, timeout_s: float | None = None
              ) -> dict[str, str]:
        """The registered names (of `keys`; all of them without), in one request."""
        meta = {"op": "names", **({"keys": keys} if keys is not None else {})}
        names = self._ask(meta, timeout_s=timeout_s).meta.get("names")
        if not isinstance(names, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
            raise ValueError(f"the name service at {self.endpoint} sent no table")
        return names

    def lookup(self, key: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        pause = BACKOFF_S[0]
        while True:
            wait = min(max(deadline - time.monotonic(), 0.0), MAX_WAIT_S)
            reply = self._ask({"op": "lookup", "key": key, "wait_s": wait}, wait).meta
            if reply["endpoint"] is not None:
                return reply["endpoint"]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no endpoint registered under '{key}' after "
                                   f"{timeout_s:.0f}s")
            if reply.get("full") is True:  # the server holds all the lookups it can
                time.sleep(min(left, pause * random.uniform(0.5, 1.0)))
                pause = min(2 * pause, BACKOFF_S[1])

    def moved(self, followed: Mapping[str, str]) -> dict[str, str]:
        if not followed:
            return {}
        changes = self._changes if self._changes is not None else self._subscribe()
        now: dict[str, str | None] = {}
        while (received := receive(changes, CHANGES.connecter_receives,
                                   self.rejects)) is not None:
            if (change := change_of(received[1])) is not None:
                now[change[0]] = change[1]
        now.update(self._sweep(list(followed)))
        return {key: endpoint for key, endpoint in now.items()
                if key in followed and endpoint and endpoint != followed[key]}

    def run_config(self) -> str:
        """The run's resolved config (YAML), as the controller's run directory holds it."""
        config = self._ask_patiently({"op": "config"}).arrays.get("config")
        if config is None or config.dtype != np.uint8 or config.ndim != 1:
            raise ValueError(f"the name service at {self.endpoint} sent no config")
        return config.tobytes().decode()

    def close(self) -> None:
        self._socket.close(linger=0)
        if self._changes is not None:
            self._changes.close(linger=0)

    def _subscribe(self) -> zmq.Socket:
        """Take the changes stream from now on (its socket); the first sweep covers the
        moments before the subscription reached the server."""
        self._changes = changes = make_socket(self._context, CHANGES.connect_type,
                                              hwm=CHANGES_QUEUE)
        changes.setsockopt(zmq.SUBSCRIBE, b"")
        changes.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        curve_connect(changes, self.get(CHANGES.key()) or self.lookup(
            CHANGES.key(), self.patience_s), self._keys)
        self._sweep_at = time.monotonic() + SWEEP_FIRST_S
        return changes

    def _sweep(self, keys: list[str]) -> dict[str, str | None]:
        """Now and then, the followed keys' endpoints in one request, without waiting for
        its answer: sent on one call, taken on a later one. An answer that does not come
        in time is given up on, and the next sweep waits longer."""
        now = time.monotonic()
        if self._sweep_id is not None:
            with self._lock:
                reply = self._sweep_reply or self._take_reply(self._sweep_id, 0)
                self._sweep_reply = None
            if reply is not None:
                self._sweep_id, self._sweep_backoff = None, SWEEP_S
                names = reply.meta.get("names")
                return {key: names[key] for key in keys if isinstance(names, dict)
                        and isinstance(names.get(key), str)}
            if now < self._sweep_sent + self.request_timeout_s:
                return {}
            log.warning("the name service at %s did not answer a sweep in %.0fs; the "
                        "endpoints in use are kept", self.endpoint, self.request_timeout_s)
            self._sweep_id = None
            self._sweep_backoff = min(2 * self._sweep_backoff, 8 * SWEEP_S)
            self._sweep_at = now + self._sweep_backoff
            return {}
        if now >= self._sweep_at:
            with self._lock:
                self._sweep_id = self._send({"op": "names", "keys": keys[:MAX_KEYS]})
            self._sweep_sent = now
            self._sweep_at = now + self._sweep_backoff * random.uniform(0.9, 1.1)
        return {}

    def _ask_patiently(self, meta: dict[str, Any]) -> Message:
        """`_ask`, asked again with backoff while the server does not answer, for up to
        `patience_s`: the name service may be restarting, or too busy for a while."""
        deadline = time.monotonic() + self.patience_s
        pause = BACKOFF_S[0]
        while True:
            try:
                return self._ask(meta)
            except TimeoutError:
                if time.monotonic() + pause >= deadline:
                    raise
                log.warning("the name service at %s did not answer %s; asking again in "
                            "%.1fs", self.endpoint, meta["op"], pause)
                time.sleep(pause)
                pause = min(2 * pause, BACKOFF_S[1])

    def _send(self, meta: dict[str, Any]) -> int | None:
        """Send one request (the lock held); its id, or None where the queue is full."""
        self._last_id += 1
        try:
            send(self._socket, "name_request", {**meta, "id": self._last_id}, flags=NOBLOCK)
        except zmq.Again:
            return None
        return self._last_id

    def _take_reply(self, request_id: int | None, timeout_s: float) -> Message | None:
        """The reply to `request_id`, waiting up to `timeout_s` (the lock held); replies to
        other requests (given up on earlier) are skipped."""
        deadline = time.monotonic() + timeout_s
        while request_id is not None and self._socket.poll(
                int(max(deadline - time.monotonic(), 0.0) * 1000)):
            received = receive(self._socket, NAMES.connecter_receives, self.rejects)
            if received is None:
                continue
            message = received[1]
            reply = message.meta
            if self._sweep_id is not None and reply.get("id") == self._sweep_id != request_id:
                self._sweep_reply = message
            if reply.get("id") != request_id:
                continue
            if "endpoint" in reply and (reply["endpoint"] is None
                                        or isinstance(reply["endpoint"], str)):
                return message
            if isinstance(reply.get("error"), str):
                return message
            self.rejects.reject(ValueError("name reply: 'endpoint' is not a string"))
        return None

    def _ask(self, meta: dict[str, Any], wait_s: float = 0.0,
             timeout_s: float | None = None) -> Message:
        """Send one request and wait for its reply."""
        with self._lock:
            limit = wait_s + (self.request_timeout_s if timeout_s is None else timeout_s)
            request_id = self._send(meta)
            if request_id is None:
                raise TimeoutError(f"the name service at {self.endpoint} takes no more "
                                   "requests")
            reply = self._take_reply(request_id, limit)
        if reply is None:
            raise TimeoutError(f"the name service at {self.endpoint} did not answer in "
                               f"{limit:.0f}s")
        if isinstance(reply.meta.get("error"), str):
            raise ValueError(f"the name service refused {meta['op']} "
                             f"{meta.get('key', '')!r}: {reply.meta['error']}")
        return reply
