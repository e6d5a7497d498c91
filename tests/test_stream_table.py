"""The stream table: keys, policy namespaces, socket pairs that ZMQ accepts, message kinds."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import zmq

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.stream_table import (
    CHANGES,
    CONTROL,
    COORDINATOR,
    INFERENCE,
    LINEAGE,
    LOGS,
    NAMES,
    PARAMS,
    POOL,
    ROWS,
    SAMPLES,
    STATS,
    STREAMS,
    Stream,
    stream_of,
)
from srl_jax.dataflow.worker_kinds import KINDS
from srl_jax.wire import codec as wire
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send

REPO = Path(__file__).resolve().parent.parent
ZMQ_STREAMS = [stream for stream in STREAMS if stream.is_zmq]
SENDERS = {
    "policy/param_stream.py": {PARAMS.connecter_receives},
    "learners/pool_publisher.py": {POOL.connecter_receives},
    "srl_jax/runtime/worker_base.py": {STATS.binder_receives},
    "srl_jax/runtime/name_server.py": {NAMES.binder_receives, NAMES.connecter_receives,
                                       CHANGES.connecter_receives},
    "srl_jax/runtime/log_stream.py": {LOGS.binder_receives},
    "srl_jax/runtime/population_link.py": {LINEAGE.connecter_receives, ROWS.connecter_receives},
    "srl_jax/runtime/population_manager.py": {CONTROL.binder_receives},
    "learners/population_member.py": {CONTROL.connecter_receives},
}
"""Each worker module and the streams it sends on (as the kinds it may send there). The
streams that may go through shared memory (samples, inserts, inference) are sent on through
the ends `Worker.connect` and `Worker.bind` make, which take their kinds from the stream
itself (srl_jax/runtime/worker_base.py), so no shell names one."""


def test_keys_of_the_default_policy_and_of_another() -> None:
    assert SAMPLES.key(index=0) == "port.samples.0"
    assert INFERENCE.key(index=3) == "port.inference.3"
    assert PARAMS.key() == "port.params"
    assert STATS.key() == "port.stats"
    assert COORDINATOR.key() == "port.coordinator"
    assert SAMPLES.key(DEFAULT_POLICY, 1) == SAMPLES.key(index=1)
    assert SAMPLES.key("red", 1) == "red/port.samples.1"
    assert PARAMS.key("red") == "red/port.params"
    assert COORDINATOR.key("red") == "red/port.coordinator"


@pytest.mark.parametrize(("stream", "policy", "index"), [
    (SAMPLES, DEFAULT_POLICY, None),  # indexed: which learner process?
    (PARAMS, DEFAULT_POLICY, 0),  # one binder per policy
    (STATS, "red", None),  # one controller for every policy
])
def test_a_key_asked_for_wrongly_is_an_error(stream: Stream, policy: str,
                                             index: int | None) -> None:
    with pytest.raises(ValueError, match=stream.name):
        stream.key(policy, index)


def test_keys_are_unique_and_lead_back_to_their_stream() -> None:
    keys = [stream.key(policy, 0 if stream.indexed else None)
            for stream in STREAMS for policy in (DEFAULT_POLICY, "red") if stream.per_policy
            or policy == DEFAULT_POLICY]
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert stream_of(key).key(*_policy_and_index(key)) == key
    for stranger in ("port.samples", "port.params.0", "red/port.stats", "inference/0", "stats"):
        with pytest.raises(KeyError):
            stream_of(stranger)


def _policy_and_index(key: str) -> tuple[str, int | None]:
    policy, _, bare = key.rpartition("/")
    last = bare.rsplit(".", 1)[-1]
    return policy or DEFAULT_POLICY, int(last) if last.isdigit() else None


def test_keys_share_no_prefix_with_metric_names() -> None:
    """`inference/batch_rows_mean` is a metric; no key may look like one."""
    for stream in STREAMS:
        key = stream.key(index=0 if stream.indexed else None)
        assert "/" not in key and not key.startswith(f"{stream.name}/")


def test_binders_and_connecters_are_worker_kinds() -> None:
    kinds = {*KINDS, "controller", "agent"}
    for stream in STREAMS:
        assert stream.binder in kinds and set(stream.connecters) <= kinds, stream.name


def test_every_message_kind_travels_on_one_stream_and_chunks_and_params_on_two() -> None:
    """A chunk goes to the learner, or to the replay servers when the algorithm learns
    from replay: the same `samples` message; parameters come from the learner, or from
    a host agent's relay, as they left the learner; every other kind has one stream."""
    carried = [kind for stream in STREAMS for kind in stream.kinds]
    assert set(carried) == wire.KINDS
    assert sorted(carried) == sorted([*wire.KINDS, "samples", "params"])


@pytest.mark.parametrize("stream", ZMQ_STREAMS, ids=lambda s: s.name)
def test_each_socket_pair_connects_and_carries_its_kinds(stream: Stream) -> None:
    """Bind and connect the declared socket types (ZMQ refuses a wrong pair in its
    handshake: nothing would arrive) and send each kind the way it travels."""
    context = zmq.Context()
    binder, connecter = make_socket(context, stream.bind_type), make_socket(
        context, stream.connect_type)
    if stream.connect_type == zmq.SUB:
        connecter.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        port = binder.bind_to_random_port("tcp://127.0.0.1")
        connecter.connect(f"tcp://127.0.0.1:{port}")
        routing: list[bytes] = []
        envelope = 1 if stream.bind_type == zmq.ROUTER else 0
        for kind in sorted(stream.binder_receives):
            send(connecter, kind, {"seq": 1}, {"x": np.zeros(2, np.float32)})
            assert binder.poll(5000), f"{kind} did not reach the {stream.name} binder"
            routing, message = receive(binder, stream.binder_receives, RejectCounter(),
                                       envelope=envelope)
            assert message.kind == kind
        for kind in sorted(stream.connecter_receives):
            message = _publish_until_received(stream, binder, connecter, kind, routing)
            assert message.kind == kind
    finally:
        binder.close(linger=0)
        connecter.close(linger=0)
        context.term()


def _publish_until_received(stream: Stream, binder: zmq.Socket, connecter: zmq.Socket,
                            kind: str, routing: list[bytes]) -> wire.Message:
    """Send from the binder until the connecter has it (a PUB drops what it sends before
    the subscription arrives)."""
    for _ in range(50):
        send(binder, kind, {"version": 1}, {}, routing=routing)
        if connecter.poll(100):
            return receive(connecter, stream.connecter_receives, RejectCounter())[1]
    raise AssertionError(f"{kind} did not reach a {stream.name} connecter")


def _sent_kinds(path: Path) -> set[str]:
    """The literal kinds a module passes to `send(socket, kind, ...)`."""
    tree = ast.parse(path.read_text())
    return {node.args[1].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "send"
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)}


@pytest.mark.parametrize("module", sorted(SENDERS))
def test_workers_send_only_the_kinds_their_streams_carry(module: str) -> None:
    sent = _sent_kinds(REPO / module)
    allowed = set().union(*SENDERS[module])
    assert sent and sent <= allowed, (module, sent, allowed)
