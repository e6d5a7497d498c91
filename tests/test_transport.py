"""Transport: CURVE off loopback, refusals counted, every port listed in status.json."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import zmq

from srl_jax.dataflow.stream_table import INFERENCE, PARAMS, SAMPLES, STATS
from srl_jax.runtime.run_dir import read_status
from srl_jax.wire.codec import Message
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import (
    KEYS_ENV,
    CurveKeys,
    Transport,
    advertised_host,
    curve_wanted,
    primary_address,
)
from tests.conftest import Processes, last_row, launch, stop_when, wait_for


@pytest.mark.parametrize("curve, host, wanted", [
    (None, "127.0.0.1", False), (None, "localhost", False), (None, "0.0.0.0", True),
    (None, "10.1.2.3", True), (True, "127.0.0.1", True), (False, "10.1.2.3", False),
])
def test_curve_is_on_off_loopback_unless_the_config_says(curve, host, wanted) -> None:
    assert curve_wanted(curve, host) is wanted


def test_a_wildcard_bind_advertises_this_hosts_address() -> None:
    assert advertised_host("0.0.0.0") == primary_address() != "0.0.0.0"
    assert advertised_host("0.0.0.0", "node-7") == "node-7"
    assert advertised_host("10.1.2.3") == "10.1.2.3"


def test_a_worker_takes_the_keys_and_addresses_its_backend_gave_it() -> None:
    keys = CurveKeys.generate()
    transport = Transport.for_process(zmq.Context(), "127.0.0.1", environ={
        KEYS_ENV: keys.to_env(), "SRL_JAX_BIND_HOST": "0.0.0.0",
        "SRL_JAX_ADVERTISE_HOST": "10.9.8.7"})
    try:
        assert (transport.keys, transport.bind_host, transport.advertise_host) == \
            (keys, "0.0.0.0", "10.9.8.7")
    finally:
        transport.close()
    plain = Transport.for_process(zmq.Context(), "127.0.0.1", environ={})
    assert not plain.authenticated and plain.refused == 0


def intruders(context: zmq.Context, endpoint: str, server_public: str) -> list[zmq.Socket]:
    """A peer with no CURVE at all, and one with keys that are not the run's."""
    plain = make_socket(context, zmq.PUSH)
    strange = make_socket(context, zmq.PUSH)
    other = CurveKeys.generate()
    strange.curve_serverkey = server_public.encode()
    strange.curve_publickey = other.client_public.encode()
    strange.curve_secretkey = other.client_secret.encode()
    for socket in (plain, strange):
        socket.connect(endpoint)
    return [plain, strange]


def test_only_peers_with_the_runs_keys_get_through_and_refusals_are_counted(
        tmp_path: Path) -> None:
    keys = CurveKeys.generate()
    names = FileNameService(tmp_path / "names")
    server, client = Transport(zmq.Context(), keys=keys), Transport(zmq.Context(), keys=keys)
    pull = make_socket(server.context, zmq.PULL)
    push = make_socket(client.context, zmq.PUSH)
    key = SAMPLES.key(index=0)
    endpoint = server.bind(pull, names, key)
    bad = intruders(zmq.Context(), endpoint, keys.server_public)
    try:
        assert names.get(key) == endpoint
        assert server.port_list() == [{"key": key, "endpoint": endpoint,
                                       "bind": endpoint.removeprefix("tcp://"),
                                       "authenticated": True}]
        for socket in bad:  # once its handshake is refused it has no pipe to queue in
            with contextlib.suppress(zmq.Again):
                send(socket, "samples", {"actor": 666}, {"x": np.zeros(3, np.float32)},
                     flags=zmq.NOBLOCK)
        client.connect(push, endpoint)
        send(push, "samples", {"actor": 0}, {"x": np.ones(3, np.float32)})
        received = receive_within(pull, 5.0)
        assert received.meta == {"actor": 0}
        wait_for(lambda: server.refused >= 2, 10, "both intruders refused")
        assert not pull.poll(500), "nothing from the intruders arrived"
    finally:
        for socket in (pull, push, *bad):
            socket.close(linger=0)
        server.close()
        client.close()


def receive_within(socket: zmq.Socket, seconds: float) -> Message:
    assert socket.poll(int(seconds * 1000)), "nothing arrived"
    received = receive(socket, SAMPLES.binder_receives, RejectCounter())
    assert received is not None
    return received[1]


def test_a_restarted_worker_binds_its_previous_port(tmp_path: Path) -> None:
    names = FileNameService(tmp_path / "names")
    gone = zmq.Context()  # the worker that died: its context ends, its port is free
    first = make_socket(gone, zmq.PULL)
    endpoint = Transport(gone).bind(first, names, INFERENCE.key(index=0))
    first.close(linger=0)
    gone.term()
    context = zmq.Context()
    again = make_socket(context, zmq.PULL)
    try:
        assert Transport(context).bind(again, names, INFERENCE.key(index=0)) == endpoint
    finally:
        again.close(linger=0)


@pytest.mark.slow
def test_a_run_on_all_interfaces_authenticates_and_refuses_strangers(
        processes: Processes, tmp_path: Path) -> None:
    """Bound to 0.0.0.0, CURVE is on by default; strangers on every port are counted and
    nothing of theirs reaches a worker, while the run trains on. It ends on Ctrl-C once
    the refusals are counted and the learner has updated since."""
    process, run_dir = launch(processes, tmp_path, "transport.bind_host=0.0.0.0",
                              "stop.target_return=null", "stop.wall_time_s=600")
    wait_for(lambda: (run_dir / "config.yaml").exists(), 60, "the run directory")
    names = FileNameService(run_dir / "names")  # not before: the run directory must be new
    keys = [STATS.key(), SAMPLES.key(index=0), PARAMS.key(), INFERENCE.key(index=0)]
    endpoints = [names.lookup(key, timeout_s=120) for key in keys]
    outsiders = zmq.Context()
    # The server key is not secret to a peer that has it: only the client key admits.
    server_public = zmq.curve_keypair()[0].decode()
    bad = [socket for endpoint in endpoints
           for socket in intruders(outsiders, endpoint, server_public)]
    try:
        for socket in bad:
            send(socket, "samples", {"actor": 0}, {"x": np.zeros(3, np.float32)},
                 flags=zmq.NOBLOCK)
        refused = wait_for(lambda: (row := last_row(run_dir)).get("system/auth_refused", 0)
                           >= len(keys) and row, 120, "the strangers refused")
        rows = stop_when(process, run_dir, lambda row: row["learner_steps"]
                         > refused["learner_steps"], 120, tmp_path / "launch.log")
    finally:
        for socket in bad:
            socket.close(linger=0)
    assert rows[-1]["system/auth_refused"] >= len(keys)
    assert rows[-1]["system/wire_rejected"] == 0, "no stranger's message was read"
    status = read_status(run_dir)
    ports = status["ports"] + [p for w in status["workers"] for p in w["ports"]]
    assert sorted(p["key"] for p in ports) == sorted(keys)
    host = primary_address()
    for port in ports:
        assert port["authenticated"] is True, port
        assert port["bind"].startswith("0.0.0.0:"), port
        assert port["endpoint"] == f"tcp://{host}:{port['bind'].split(':')[1]}", port
    config = (run_dir / "config.yaml").read_text()
    assert "secret" not in config and "KEYS" not in json.dumps(status)
