"""The name service, both ways: files in the run directory, and the controller's server.

Every `NameService` runs the same suite: the file service, a worker's network client
(CURVE on, over TCP to a real `NameServer`), and the server itself as the controller
uses it in process. The server's own refusals, and a client without the run's key,
follow.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

import srl_jax.wire.names as file_names
from srl_jax.dataflow.stream_table import INFERENCE, NAMES, PARAMS, SAMPLES, STATS
from srl_jax.launch import network_names
from srl_jax.runtime import name_client, name_server
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.name_server import NameServer
from srl_jax.wire.codec import WIRE_VERSION
from srl_jax.wire.names import FileNameService, NameService
from srl_jax.wire.streams import make_socket, receive, send
from srl_jax.wire.transport import CurveKeys, Transport, curve_connect
from tests.conftest import make_config

RUN_CONFIG = "name: names-test\nseed: 3\n"
KEY = SAMPLES.key("red", 1)
"""A key in a policy's namespace: it has a '/'."""


class Server:
    """A `NameServer` on loopback with CURVE on, and clients of it."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.keys = CurveKeys.generate()
        self.transport = Transport(self.context, keys=self.keys)
        self.server = NameServer(self.transport, RUN_CONFIG)
        self.clients: list[NetworkNameService] = []

    def client(self, keys: CurveKeys | None = None, **options: float) -> NetworkNameService:
        client = NetworkNameService(self.context, self.server.endpoint, keys or self.keys,
                                    **options)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.close()
        self.transport.close()
        self.context.term()


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server()
    yield served
    served.close()


@pytest.fixture(params=["files", "network", "in_process"])
def names(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[NameService,
                                                                             NameService]]:
    """(the service under test, another user of the same names)."""
    if request.param == "files":
        yield FileNameService(tmp_path / "names"), FileNameService(tmp_path / "names")
        return
    served = Server()
    if request.param == "network":
        yield served.client(), served.client()
    else:
        yield served.server, served.client()
    served.close()


def test_a_registered_endpoint_is_what_another_user_finds(names) -> None:
    service, other = names
    service.register(KEY, "tcp://10.0.0.1:5000")
    assert other.get(KEY) == "tcp://10.0.0.1:5000"
    assert other.lookup(KEY, timeout_s=1) == "tcp://10.0.0.1:5000"
    assert service.get(INFERENCE.key(index=0)) is None


def test_register_replaces_and_unregister_forgets(names) -> None:
    service, other = names
    other.register(PARAMS.key(), "tcp://10.0.0.1:5000")
    service.register(PARAMS.key(), "tcp://10.0.0.2:6000")
    assert other.get(PARAMS.key()) == "tcp://10.0.0.2:6000"
    other.unregister(PARAMS.key())
    assert service.get(PARAMS.key()) is None
    service.unregister(PARAMS.key())  # gone already: nothing to do


def registered_late(waiter: NameService, registrar: NameService, key: str,
                    delay_s: float) -> float:
    """How long `waiter`'s lookup of `key` took, `registrar` registering it `delay_s` in."""
    endpoint = "tcp://10.0.0.3:7000"
    late = threading.Timer(delay_s, registrar.register, (key, endpoint))
    started = time.monotonic()
    late.start()
    try:
        assert waiter.lookup(key, timeout_s=20) == endpoint
    finally:
        late.join()
    return time.monotonic() - started


def test_a_lookup_waits_for_a_late_registration(names) -> None:
    service, other = names
    assert 0.25 <= registered_late(service, other, KEY, 0.3) < 10


@pytest.mark.skipif(sys.platform != "linux", reason="files are watched with Linux's inotify")
def test_a_waiting_lookup_hears_of_its_key_at_once_not_at_a_next_check(
        names, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the file service's checks and the server's turns 30 s apart, a lookup still
    returns as its key is registered: a file written wakes the file lookup, a register
    (over the network or in the server's process) answers the held network lookup."""
    monkeypatch.setattr(file_names, "POLL_S", 30.0)
    monkeypatch.setattr(name_server, "POLL_MS", 30_000)
    service, other = names
    for waiter, registrar, key in ((service, other, KEY), (other, service, PARAMS.key())):
        assert registered_late(waiter, registrar, key, 0.2) < 5


def test_a_lookup_gives_up_at_its_timeout_naming_the_key(names) -> None:
    service, _ = names
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=INFERENCE.key(index=4)):
        service.lookup(INFERENCE.key(index=4), timeout_s=0.3)
    assert 0.25 <= time.monotonic() - started < 5


def test_a_lookup_that_finds_the_server_full_backs_off(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no room for held lookups every lookup of a missing key is answered at once,
    `full`: the client asks again after pauses that double (BACKOFF_S scaled to a tenth:
    0.05 s to 0.8 s), a handful of requests in the 0.6 s before its key comes, not the
    thousands of a tight loop, and it still finds the key once registered."""
    monkeypatch.setattr(name_server, "MAX_HELD", 0)
    monkeypatch.setattr(name_client, "BACKOFF_S", (0.05, 0.8))
    client = server.client()
    before = server.server.requests
    late = threading.Timer(0.6, server.server.register, (KEY, "tcp://10.0.0.3:7000"))
    late.start()
    try:
        assert client.lookup(KEY, timeout_s=20) == "tcp://10.0.0.3:7000"
    finally:
        late.join()
    assert 3 <= server.server.requests - before <= 8


def test_the_server_hands_out_the_run_config(server: Server) -> None:
    assert server.client().run_config() == RUN_CONFIG


def test_malformed_and_wrong_requests_are_counted_and_the_server_answers_on(
        server: Server) -> None:
    raw = make_socket(server.context, NAMES.connect_type)
    curve_connect(raw, server.server.endpoint, server.keys)
    try:
        raw.send(b"\xc1 not msgpack")  # dropped: no reply
        raw.send(msgpack.packb({"k": "stats", "v": WIRE_VERSION, "m": {}, "a": []}))
        wrong = [{"op": "rename", "id": 1, "key": KEY},  # no such op
                 {"op": "get", "key": KEY},  # no id
                 {"op": "register", "id": 2, "key": "../../etc/passwd", "endpoint": "x"},
                 {"op": "register", "id": 3, "key": STATS.key(), "endpoint": "tcp://evil:1"},
                 {"op": "lookup", "id": 4, "key": KEY, "wait_s": "forever"},
                 {"op": "get", "id": 5, "key": "k" * 10_000}]
        for meta in wrong:
            send(raw, "name_request", meta)
            assert raw.poll(5000), meta
            reply = receive(raw, NAMES.connecter_receives, server.server.rejects)[1].meta
            assert reply["id"] == meta.get("id") and reply["error"], (meta, reply)
        assert server.server.rejects.count == 2 + len(wrong)
    finally:
        raw.close()
    client = server.client()
    with pytest.raises(ValueError, match="the controller's own"):
        client.register(STATS.key(), "tcp://evil:1")
    client.register(KEY, "tcp://10.0.0.1:5000")
    assert client.get(KEY) == "tcp://10.0.0.1:5000"


def test_a_client_without_the_run_key_is_refused(server: Server) -> None:
    stranger = server.client(keys=CurveKeys.generate(), request_timeout_s=0.5, patience_s=1.0)
    with pytest.raises(TimeoutError, match="did not answer"):
        stranger.get(KEY)
    assert server.transport.refused >= 1
    assert server.client().get(KEY) is None, "the run's own clients are still answered"


def test_a_reply_to_a_request_given_up_on_is_not_taken_for_the_next(server: Server) -> None:
    """A lookup held at the server past the client's patience is answered later; the
    client's next request must get its own answer, not that one."""
    client = server.client(request_timeout_s=0.1)
    with pytest.raises(TimeoutError):
        client._ask({"op": "lookup", "key": KEY, "wait_s": 0.5})  # held 0.5 s, waited 0.1
    server.server.register(KEY, "tcp://10.0.0.9:9")
    time.sleep(0.1)  # the held lookup's answer is on its way
    client.request_timeout_s = 5.0
    assert client.get(PARAMS.key()) is None
    assert client.get(KEY) == "tcp://10.0.0.9:9"


@pytest.mark.parametrize(("names", "backend", "address", "network"), [
    ("auto", "local", None, False),
    ("auto", "ray", None, False),  # a local Ray instance: this host only
    ("auto", "ray", "10.0.0.1:6379", True),  # a cluster: hosts may share nothing
    ("files", "ray", "10.0.0.1:6379", False),
    ("network", "local", None, True),
])
def test_auto_serves_names_over_the_network_where_hosts_may_share_nothing(
        names: str, backend: str, address: str | None, network: bool) -> None:
    assert network_names(make_config([f"runtime.names={names}"]), backend, address) is network
    assert network_names(make_config(["runtime.names=auto", "ray.address=10.0.0.1:6379"]),
                         "ray", None)


def test_a_follower_hears_of_a_move_without_asking_again(names) -> None:
    service, other = names
    other.register(KEY, "tcp://10.0.0.1:1")
    followed = {KEY: service.lookup(KEY, timeout_s=5)}
    assert service.moved(followed) == {}, "nothing moved yet"
    time.sleep(0.3)  # a network client's first `moved` subscribed; the subscription lands
    other.register(KEY, "tcp://10.0.0.2:2")
    moved = wait_moved(service, followed)
    assert moved == {KEY: "tcp://10.0.0.2:2"}


def wait_moved(service: NameService, followed: dict[str, str],
               timeout_s: float = 5.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while not (moved := service.moved(followed)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return moved


@pytest.mark.slow
def test_a_name_service_stalled_past_the_old_timeout_stops_no_follower(server: Server) -> None:
    """The server's thread blocks for 12 s, past the 10 s a worker's heartbeat once waited
    for a `get` before it raised and the worker exited: a follower's `moved` neither
    raises nor waits meanwhile, keeps its endpoint, and hears of the move made during
    the stall once the server is back."""
    server.server.register(KEY, "tcp://10.0.0.1:1")
    client = server.client()
    followed = {KEY: client.lookup(KEY, timeout_s=5)}
    client.moved(followed)
    answer, stalled = server.server._answer, threading.Event()

    def stall(*args: object) -> None:
        if not stalled.is_set():
            stalled.set()
            time.sleep(12.0)
        answer(*args)

    server.server._answer = stall
    asker = server.client(request_timeout_s=0.5, patience_s=0.5)
    with pytest.raises(TimeoutError):
        asker.get(PARAMS.key())  # the request the thread stalls on
    assert stalled.is_set()
    server.server.register(KEY, "tcp://10.0.0.2:2")  # published once the thread is back
    started = time.monotonic()
    slowest = 0.0
    while time.monotonic() - started < 11.0:
        call = time.monotonic()
        assert client.moved(followed) == {}, "the move waits for the stalled thread"
        slowest = max(slowest, time.monotonic() - call)
        time.sleep(0.1)
    assert slowest < 0.5, f"a follow waited {slowest:.1f}s on the stalled service"
    assert wait_moved(client, followed, timeout_s=10) == {KEY: "tcp://10.0.0.2:2"}
