"""The inference server as a real process: waiting for the learner's first parameters,
batching across actors, new parameters, bad input."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import msgpack
import numpy as np
import pytest
import zmq

from actors.envs import env_spec
from learners.models.networks import init_policy_params, make_policy
from learners.models.param_codec import params_to_arrays
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.stream_table import INFERENCE, PARAMS
from srl_jax.wire import codec as wire
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import Transport
from tests.conftest import Processes, make_config, wait_for, write_run_dir

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 10.0
CLIENT_ROWS = (3, 5, 7)
MAX_BATCH = 12
"""Less than the three clients' rows together: each round, one request waits for the next
batch, and is served with no request after it."""


class Server:
    """One inference server process, the learner's PUB it listens to, and actor stand-ins."""

    def __init__(self, tmp_path: Path, processes: Processes, stats: zmq.Socket,
                 overrides: tuple[str, ...] = ()) -> None:
        """`overrides`: config keys on top of this file's batching settings."""
        self.run_dir = tmp_path / "run"  # where the stats_socket fixture registered itself
        self.config = make_config([f"inference.max_batch={MAX_BATCH}",
                                   "inference.max_wait_ms=20", *overrides])
        write_run_dir(self.run_dir, self.config)
        self.names = FileNameService(self.run_dir / "names")
        self.context = zmq.Context.instance()
        self.sockets: list[zmq.Socket] = []
        self.pub = self.socket(zmq.PUB)
        Transport(self.context).bind(self.pub, self.names, PARAMS.key())
        self.stats = stats
        self.process = processes.worker("inference", 0, self.run_dir)
        self.endpoint = self.names.lookup(INFERENCE.key(index=0), timeout_s=START_TIMEOUT_S)
        self.rejects = RejectCounter()

    def socket(self, kind: int) -> zmq.Socket:
        socket = make_socket(self.context, kind)
        self.sockets.append(socket)
        return socket

    def dealer(self) -> zmq.Socket:
        dealer = self.socket(zmq.DEALER)
        dealer.connect(self.endpoint)
        return dealer

    def reply(self, dealer: zmq.Socket, timeout_s: float = REPLY_TIMEOUT_S) -> wire.Message:
        assert dealer.poll(timeout_s * 1000), f"no reply within {timeout_s}s ({self.log_tail()})"
        received = receive(dealer, INFERENCE.connecter_receives, self.rejects)
        assert received is not None and self.rejects.count == 0, "malformed reply"
        return received[1]

    def publish_until_answered(self, params: Any, client: zmq.Socket) -> None:
        """Publish `params` as version 0, the learner's first, until `client` has a reply
        waiting: the server answers nothing before them, and the first messages may be
        lost (slow joiner)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not client.poll(100):
            assert time.monotonic() < deadline, f"version 0 never answered ({self.log_tail()})"
            send(self.pub, "params", {"version": 0}, params_to_arrays(params))

    def log_tail(self) -> str:
        path = self.run_dir / "logs" / "inference-0.log"
        text = path.read_text() if path.exists() else ""
        return f"exit code {self.process.poll()}, log tail: {text[-1500:]}"

    def latest_heartbeat(self) -> dict[str, Any] | None:
        """The newest heartbeat's metadata waiting on the stats stream, if any."""
        meta = None
        while self.stats.poll(0):
            message = wire.decode(self.stats.recv_multipart(copy=False))
            if message.kind == "stats" and message.meta.get("worker") == "inference-0":
                meta = message.meta
        return meta

    def latest_counters(self) -> dict[str, Any] | None:
        """Counters of the newest heartbeat waiting on the stats stream, if any."""
        meta = self.latest_heartbeat()
        return None if meta is None else meta["counters"]

    def close(self) -> None:
        for socket in self.sockets:
            socket.close()


@pytest.fixture
def server(tmp_path: Path, processes: Processes, stats_socket: zmq.Socket):
    server = Server(tmp_path, processes, stats_socket)
    yield server
    server.close()


def observations(rows: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-0.2, 0.2, size=(rows, 4)).astype(np.float32)


def expected_outputs(config: ExperimentConfig, params: Any, obs: np.ndarray) -> tuple:
    """Log-probabilities [n, actions] and values [n] of `params` for `obs`, computed here."""
    policy, _ = make_policy(config, env_spec(config.env))
    logits, value, _ = policy.apply(params, obs, np.zeros((len(obs), 0), np.float32))
    return np.asarray(jax.nn.log_softmax(logits)), np.asarray(value)


def check_reply(reply: wire.Message, seq: int, obs: np.ndarray, version: int,
                logp_table: np.ndarray | None = None, values: np.ndarray | None = None) -> None:
    rows = obs.shape[0]
    assert reply.kind == "infer_reply"
    assert reply.meta["split"] == 0 and reply.meta["seq"] == seq
    assert reply.meta["version"] == version
    action, logp, value = (reply.arrays[k] for k in ("action", "logp", "value"))
    assert action.dtype == np.int32 and action.shape == (rows,)
    assert set(action.tolist()) <= {0, 1}
    assert logp.shape == (rows,) and np.all(logp <= 0) and np.all(np.isfinite(logp))
    assert value.shape == (rows,) and np.all(np.isfinite(value))
    assert reply.meta["batch_rows"] >= rows
    if logp_table is not None:
        np.testing.assert_allclose(logp, logp_table[np.arange(rows), action], rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(value, values, rtol=1e-4, atol=1e-5)


def waits_for_the_first_parameters(server: Server, params0: Any,
                                   rng: np.random.Generator) -> None:
    """The server builds no parameters: it answers nothing before the learner's first, and
    its heartbeats say so; a request sent meanwhile waits for them, and is answered with
    them (version 0)."""
    client = server.dealer()
    obs = observations(4, rng)
    send(client, "infer_request", {"split": 0, "seq": 0}, {"obs": obs})

    def waits_on_params() -> bool:
        meta = server.latest_heartbeat()
        return meta is not None and (meta["waiting"] or [""])[0] == \
            "the first parameters of policy 'default'"

    wait_for(waits_on_params, START_TIMEOUT_S, "a heartbeat waiting on the first parameters")
    assert not client.poll(500), "answered before any parameters came"
    server.publish_until_answered(params0, client)
    check_reply(server.reply(client), 0, obs, 0, *expected_outputs(server.config, params0, obs))


def serves_batches_across_actors(server: Server, params0: Any,
                                 rng: np.random.Generator) -> None:
    """Three actors ask at the same moment, a few rounds in a row; version 0 answers, in
    batches of at most max_batch rows."""
    clients = [server.dealer() for _ in CLIENT_ROWS]
    batched = []
    for seq in range(6):
        sent = [observations(rows, rng) for rows in CLIENT_ROWS]
        for client, obs in zip(clients, sent, strict=True):
            send(client, "infer_request", {"split": 0, "seq": seq}, {"obs": obs})
        timeout = START_TIMEOUT_S if seq == 0 else REPLY_TIMEOUT_S
        for client, obs in zip(clients, sent, strict=True):
            reply = server.reply(client, timeout)
            check_reply(reply, seq, obs, 0, *expected_outputs(server.config, params0, obs))
            assert reply.meta["batch_rows"] <= MAX_BATCH
            batched.append(reply.meta["batch_rows"] > obs.shape[0])
    assert any(batched), "no batch ever held the requests of more than one actor"


def bad_messages(rng: np.random.Generator) -> list[list[bytes]]:
    """Malformed or unexpected requests, each of which must be counted and dropped."""
    f4 = np.dtype("<f4").str

    def header(**fields: Any) -> bytes:
        return msgpack.packb({"k": "infer_request", "v": wire.WIRE_VERSION,
                              "m": {"split": 0, "seq": 0}, "a": [], **fields})

    def request(obs: np.ndarray) -> list:
        return wire.encode("infer_request", {"split": 0, "seq": 0}, {"obs": obs})

    return [
        [b"\xc1" + rng.bytes(63)],  # not msgpack
        [rng.bytes(32), rng.bytes(16)],
        [header(v=wire.WIRE_VERSION + 1)],  # wrong version
        [msgpack.packb(["infer_request", 1])],  # header not a map
        [header(a=[["obs", f4, [2, 4]]])],  # array declared, frame missing
        [header(a=[["obs", f4, [2, 4]]]), rng.bytes(31)],  # buffer of the wrong size
        [header(a=[["obs", "|O", [2, 4]]]), rng.bytes(64)],  # object dtype
        wire.encode("params", {"version": 9}, {"obs": observations(2, rng)}),  # wrong kind
        request(np.zeros((3, 5), np.float32)),  # obs of the wrong shape
        request(np.zeros((12,), np.float32)),  # obs without a batch axis
        request(np.zeros((0, 4), np.float32)),  # no rows
        request(np.zeros((MAX_BATCH + 1, 4), np.float32)),  # more rows than max_batch
        wire.encode("infer_request", {"split": 0, "seq": 0}, {"x": observations(2, rng)}),
        wire.encode("infer_request", {"split": 0, "seq": 0},  # CartPole masks no action
                    {"obs": observations(2, rng), "action_mask": np.ones((2, 2), bool)}),
    ]


def drops_and_counts_malformed_requests(server: Server, rng: np.random.Generator) -> None:
    """Garbage from one client is counted and dropped; everyone is still served."""
    good, bad = server.dealer(), server.dealer()
    obs = observations(6, rng)
    before = wait_for(server.latest_counters, 10, "a heartbeat")["wire_rejected"]
    messages = bad_messages(rng)
    for frames in messages:
        bad.send_multipart(frames)
    for seq, client in enumerate((good, bad), start=1):  # good requests right behind them
        send(client, "infer_request", {"split": 0, "seq": seq}, {"obs": obs})
        check_reply(server.reply(client), seq, obs, 0)
    assert not bad.poll(200), "a malformed request got a reply"
    assert server.process.poll() is None, server.log_tail()

    def rejected_all() -> bool:
        counters = server.latest_counters()
        return counters is not None and counters["wire_rejected"] - before >= len(messages)

    wait_for(rejected_all, 10, f"wire_rejected to grow by {len(messages)}")


def takes_newer_params(server: Server, params0: Any, params5: Any,
                       rng: np.random.Generator) -> None:
    """The learner publishes version 5; the first messages may be lost (slow joiner)."""
    client = server.dealer()
    obs = observations(4, rng)
    deadline = time.monotonic() + 30
    seq, reply = 0, None
    while reply is None or reply.meta["version"] != 5:
        assert time.monotonic() < deadline, "version 5 never reached the replies"
        send(server.pub, "params", {"version": 5}, params_to_arrays(params5))
        time.sleep(0.1)
        seq += 1
        send(client, "infer_request", {"split": 0, "seq": seq}, {"obs": obs})
        reply = server.reply(client)
        assert reply.meta["seq"] == seq
        assert reply.meta["version"] in (0, 5)
    check_reply(reply, seq, obs, 5, *expected_outputs(server.config, params5, obs))
    _, values0 = expected_outputs(server.config, params0, obs)
    assert not np.allclose(reply.arrays["value"], values0), "values still from version 0"

    # An older version arriving later does not replace the newer one.
    for _ in range(5):
        send(server.pub, "params", {"version": 3}, params_to_arrays(params0))
    time.sleep(0.5)
    send(client, "infer_request", {"split": 0, "seq": seq + 1}, {"obs": obs})
    check_reply(server.reply(client), seq + 1, obs, 5,
                *expected_outputs(server.config, params5, obs))
    server.latest_counters()  # skip heartbeats sent before the last reply
    counters = wait_for(server.latest_counters, 10, "a heartbeat from the inference server")
    assert counters["policy_version"] == 5
    assert counters["param_updates"] == 2, "version 0, then 5"


def test_inference_server_batches_survives_garbage_and_takes_params(server: Server) -> None:
    """One server process through its life (one start-up keeps the file fast)."""
    rng = np.random.default_rng(0)
    spec = env_spec(server.config.env)
    _, network = make_policy(server.config, spec)
    params0 = init_policy_params(network, spec.obs_shape, server.config.seed)
    params5 = init_policy_params(network, spec.obs_shape, server.config.seed + 99)

    waits_for_the_first_parameters(server, params0, rng)
    serves_batches_across_actors(server, params0, rng)
    drops_and_counts_malformed_requests(server, rng)
    takes_newer_params(server, params0, params5, rng)
    assert server.process.poll() is None, server.log_tail()

    # A worker told to stop (SIGTERM, by pid) exits cleanly.
    server.process.terminate()
    assert server.process.wait(timeout=10) == 0, server.log_tail()
