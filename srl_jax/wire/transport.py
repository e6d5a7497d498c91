"""Transport: where sockets bind, what they advertise, and CURVE off loopback.

On loopback (the local backend) only this machine's users reach a port, and
CURVE stays off. Bound to any other interface, CURVE is on unless the config
says `transport.curve: false`: every bound socket is a CURVE server holding the
run's server key, every connecting socket a CURVE client holding the run's
client key, and a ZAP handler in each process admits that client key alone.
A peer without the keys fails the handshake and is counted (`auth_refused`).

The controller makes the keys once per run and hands them to workers through
the launch backend (`SRL_JAX_CURVE_KEYS` in the worker's environment, which
only its user can read); they are never written to a file. A worker given
keys turns CURVE on, so the whole run agrees.
"""

from __future__ import annotations

import json
import logging
import os
import socket as pysocket
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from srl_jax.wire.names import NameService

log = logging.getLogger(__name__)

KEYS_ENV = "SRL_JAX_CURVE_KEYS"
BIND_HOST_ENV = "SRL_JAX_BIND_HOST"
ADVERTISE_HOST_ENV = "SRL_JAX_ADVERTISE_HOST"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
REFUSED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
GUARD_POLL_MS = 100
MAX_LOGGED_REFUSALS = 8


@dataclass(frozen=True)
class CurveKeys:
    """The run's two CURVE key pairs (Z85 text): every process serves and connects."""

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @classmethod
    def generate(cls) -> CurveKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public.decode(), server_secret.decode(),
                   client_public.decode(), client_secret.decode())

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> CurveKeys:
        return cls(**json.loads(text))


def keys_from_env(environ: Mapping[str, str]) -> CurveKeys | None:
    """The run's keys a launch backend handed this process, or None (CURVE off)."""
    return CurveKeys.from_env(environ[KEYS_ENV]) if environ.get(KEYS_ENV) else None


def curve_connect(socket: zmq.Socket, endpoint: str, keys: CurveKeys | None) -> None:
    """Connect `socket` to `endpoint`, as a CURVE client of the run when it has `keys`."""
    if keys:
        socket.curve_serverkey = keys.server_public.encode()
        socket.curve_publickey = keys.client_public.encode()
        socket.curve_secretkey = keys.client_secret.encode()
    socket.connect(endpoint)


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def curve_wanted(curve: bool | None, bind_host: str) -> bool:
    """Whether a run binding `bind_host` authenticates (`transport.curve`; None: off
    loopback only)."""
    return curve if curve is not None else not is_loopback(bind_host)


def advertised_host(bind_host: str, advertise_host: str = "") -> str:
    """The address peers dial: the bind address, unless it is a wildcard."""
    if advertise_host:
        return advertise_host
    if bind_host in ("0.0.0.0", "*", ""):
        return primary_address()
    return bind_host


def primary_address() -> str:
    """This host's address on its default route (a UDP 'connect' sends nothing); the
    host name's address where there is no route (host names often map to 127.0.1.1)."""
    with pysocket.socket(pysocket.AF_INET, pysocket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: only the route is looked up
            return probe.getsockname()[0]
        except OSError:
            return pysocket.gethostbyname(pysocket.gethostname())


@dataclass(frozen=True)
class Port:
    """One listening port, as `status.json` lists it."""

    key: str
    endpoint: str
    bind: str
    authenticated: bool


class Transport:
    """Binds and connects one process's sockets, with CURVE when the run has keys."""

    def __init__(self, context: zmq.Context, bind_host: str = "127.0.0.1",
                 advertise_host: str = "", keys: CurveKeys | None = None) -> None:
        self.context = context
        self.bind_host = bind_host
        self.advertise_host = advertised_host(bind_host, advertise_host)
        self.keys = keys
        self.ports: list[Port] = []
        self._guard = _Guard(context, keys.client_public) if keys else None

    @classmethod
    def for_process(cls, context: zmq.Context, bind_host: str, advertise_host: str = "",
                    environ: Mapping[str, str] | None = None) -> Transport:
        """The transport a worker was given: the backend's environment over the config."""
        env = os.environ if environ is None else environ
        return cls(context, env.get(BIND_HOST_ENV) or bind_host,
                   env.get(ADVERTISE_HOST_ENV) or advertise_host, keys_from_env(env))

    @property
    def authenticated(self) -> bool:
        return self.keys is not None

    @property
    def refused(self) -> int:
        """Connections refused at the CURVE handshake (no key, or not the run's)."""
        return self._guard.refused if self._guard else 0

    def bind(self, socket: zmq.Socket, names: NameService, key: str,
             endpoint: str | None = None) -> str:
        """Bind `socket` and register the endpoint under `key` in `names`.

        A restarted worker binds the port it had before, so peers that are
        already connected reconnect by themselves. `endpoint`: bind exactly there (a
        host agent's local `ipc://` addresses, the same for each of its starts).
        """
        if self.keys and self._guard:  # the guard comes with the keys
            socket.curve_server = True
            socket.curve_secretkey = self.keys.server_secret.encode()
            self._guard.watch(socket)
        if endpoint is not None:
            socket.bind(endpoint)
            names.register(key, endpoint)
            self.ports.append(Port(key, endpoint, endpoint, self.authenticated))
            return endpoint
        port = None
        previous = names.get(key)
        if previous and previous.startswith(f"tcp://{self.advertise_host}:"):
            try:
                port = int(previous.rsplit(":", 1)[1])
                socket.bind(f"tcp://{self.bind_host}:{port}")
            except zmq.ZMQError:
                log.info("previous port %d for %s is taken; binding a new one", port, key)
                port = None
        if port is None:
            port = socket.bind_to_random_port(f"tcp://{self.bind_host}")
        endpoint = f"tcp://{self.advertise_host}:{port}"
        if endpoint != previous:
            names.register(key, endpoint)
        self.ports.append(Port(key, endpoint, f"{self.bind_host}:{port}", self.authenticated))
        return endpoint

    def note_port(self, key: str, address: str, authenticated: bool = False) -> None:
        """A port this process opened outside ZMQ (e.g. jax.distributed's coordinator)."""
        self.ports.append(Port(key, address, address, authenticated))

    def connect(self, socket: zmq.Socket, endpoint: str) -> None:
        curve_connect(socket, endpoint, self.keys)

    def port_list(self) -> list[dict[str, Any]]:
        return [asdict(port) for port in self.ports]

    def close(self) -> None:
        if self._guard:
            self._guard.stop()


class _Guard(threading.Thread):
    """Answers ZAP requests (the run's client key only) and counts failed handshakes."""

    def __init__(self, context: zmq.Context, client_public: str) -> None:
        super().__init__(name="curve-guard", daemon=True)
        self.context = context
        self.allowed = z85.decode(client_public.encode())
        self.refused = 0
        self._monitors: list[str] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: zmq.ZMQError | None = None
        self.start()
        self._ready.wait()
        if self._error is not None:  # another transport answers ZAP in this context
            raise self._error

    def watch(self, socket: zmq.Socket) -> None:
        """Count the handshakes `socket` (a CURVE server) refuses."""
        address = f"inproc://curve-monitor-{id(socket)}-{len(self._monitors)}"
        socket.monitor(address, REFUSED_EVENTS)
        with self._lock:
            self._monitors.append(address)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=2)

    def run(self) -> None:
        zap = self.context.socket(zmq.REP)
        zap.linger = 0
        try:
            zap.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as error:
            self._error = error
            zap.close()
            return
        finally:
            self._ready.set()
        poller = zmq.Poller()
        monitors: list[zmq.Socket] = []
        poller.register(zap, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                with self._lock:
                    new = self._monitors[len(monitors):]
                for address in new:
                    monitor = self.context.socket(zmq.PAIR)
                    monitor.linger = 0
                    monitor.connect(address)
                    poller.register(monitor, zmq.POLLIN)
                    monitors.append(monitor)
                for socket, _ in poller.poll(GUARD_POLL_MS):
                    if socket is zap:
                        self._answer(zap)
                    else:
                        self._count(socket)
        finally:
            for socket in (zap, *monitors):
                socket.close(linger=0)

    def _answer(self, zap: zmq.Socket) -> None:
        """ZAP 1.0: [version, id, domain, address, identity, mechanism, credentials...]."""
        frames = zap.recv_multipart()
        request_id = frames[1] if len(frames) > 1 else b""
        ok = (len(frames) >= 7 and frames[0] == b"1.0" and frames[5] == b"CURVE"
              and frames[6] == self.allowed)
        if not ok and self.refused < MAX_LOGGED_REFUSALS:
            peer = frames[3].decode(errors="replace") if len(frames) > 3 else "?"
            log.warning("refused a connection from %s without the run's CURVE key", peer)
        zap.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                            b"OK" if ok else b"not this run's key", b"", b""])

    def _count(self, monitor: zmq.Socket) -> None:
        event = parse_monitor_message(monitor.recv_multipart())
        if event["event"] & REFUSED_EVENTS:
            self.refused += 1
