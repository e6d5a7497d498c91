"""How the inference server cuts requests into batches: a server in this process on real
sockets, acting with a stand-in for the network that records every call, so that each
forward pass it runs is seen (the server as a process: tests/test_inference_server.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from learners.models.outputs import pack_outputs
from policy.inference_server import InferenceServer
from policy.policy_runner import PolicyRunner, padded_sizes
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.stream_table import INFERENCE, PARAMS
from srl_jax.wire import codec as wire
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import Transport
from tests.conftest import make_config

MAX_BATCH = 8
MAX_WAIT_MS = 50


class Served:
    """An inference server of `MAX_BATCH` rows, the learner's end of the parameter
    stream (it sends nothing), actor stand-ins, and the sizes of the calls it ran."""

    def __init__(self, tmp_path: Path, max_wait_ms: int = MAX_WAIT_MS) -> None:
        self.config = make_config([f"inference.max_batch={MAX_BATCH}",
                                   f"inference.max_wait_ms={max_wait_ms}",
                                   "inference.min_padded_batch=2"])
        self.names = names = FileNameService(tmp_path / "names")
        self.context = zmq.Context.instance()
        self.sockets = [make_socket(self.context, PARAMS.bind_type)]
        Transport(self.context).bind(self.sockets[0], names, PARAMS.key())
        self.calls: list[int] = []
        """The padded rows of every forward pass, from the compiles in `setup` on."""
        self.server = InferenceServer(self.config, 0, tmp_path, names,
                                      runner_factory=self.runner)
        self.server.setup()
        self.compiled = list(self.calls)
        self.rejects = RejectCounter()

    def runner(self, config: ExperimentConfig, spec: EnvSpec, sampling_seed: int,
               min_size: int, max_size: int, published: bool) -> PolicyRunner:
        def act(params: Any, obs: np.ndarray, state: np.ndarray, mask: np.ndarray, key: Any,
                counter: Any) -> np.ndarray:
            self.calls.append(obs.shape[0])
            rows = obs.shape[0]
            return pack_outputs(np.zeros(rows, np.int32), np.zeros(rows, np.float32),
                                obs[:, 0], state, xp=np)

        runner = PolicyRunner(act, {}, spec, padded_sizes(min_size, max_size), sampling_seed)
        runner.set_params({}, version=0)  # taken: the server does not wait for a learner's
        return runner

    def dealer(self) -> zmq.Socket:
        dealer = make_socket(self.context, INFERENCE.connect_type)
        dealer.connect(self.names.lookup(INFERENCE.key(index=0), timeout_s=5))
        self.sockets.append(dealer)
        return dealer

    def ask(self, dealer: zmq.Socket, seq: int, rows: int) -> np.ndarray:
        """Send a request of `rows` rows, each row's first value its place: `seq + i/100`."""
        obs = np.zeros((rows, 4), np.float32)
        obs[:, 0] = seq + np.arange(rows) / 100
        send(dealer, "infer_request", {"split": 0, "seq": seq}, {"obs": obs})
        return obs

    def reply(self, dealer: zmq.Socket, timeout_ms: int = 1000) -> wire.Message | None:
        if not dealer.poll(timeout_ms):
            return None
        received = receive(dealer, INFERENCE.connecter_receives, self.rejects)
        assert received is not None and self.rejects.count == 0, "malformed reply"
        return received[1]

    def close(self) -> None:
        self.server.close()
        for socket in self.sockets:
            socket.close(linger=0)


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """A `Served`; its `max_wait_ms` is `MAX_WAIT_MS` unless parametrized indirectly."""
    served = Served(tmp_path, getattr(request, "param", MAX_WAIT_MS))
    yield served
    served.close()


@pytest.mark.parametrize("served", [2000], indirect=True)
def test_two_requests_past_max_batch_are_two_batches_the_second_served_on_its_own(served):
    """mpe_spread_ppo in small: two requests that together overflow the batch. Whichever
    the server reads second starts the next batch, and is answered on the next turn with
    no request after it. The wait (2 s) is long enough that both are read in the first
    turn (requests on new connections may reach the server in either order, far apart)."""
    dealers = {1: served.dealer(), 2: served.dealer()}
    for seq, dealer in dealers.items():
        served.ask(dealer, seq, 5)
    assert served.server.inference.wait(5000), "the requests reach the server"
    served.server.run_once()
    replies = {seq: served.reply(dealer, timeout_ms=1000) for seq, dealer in dealers.items()}
    answered = [seq for seq, reply in replies.items() if reply is not None]
    assert len(answered) == 1, f"5 + 5 rows would overflow max_batch 8: {replies}"
    assert replies[answered[0]].meta["batch_rows"] == 5
    (held,) = set(dealers) - set(answered)
    served.server.run_once()  # nothing more was sent
    reply = served.reply(dealers[held])
    assert reply is not None, "the request that started the next batch was left waiting"
    assert reply.meta["seq"] == held and reply.meta["batch_rows"] == 5
    np.testing.assert_allclose(reply.arrays["value"], held + np.arange(5) / 100)
    assert served.calls[len(served.compiled):] == [8, 8]


@pytest.mark.parametrize("seed", range(3))
def test_batches_never_exceed_max_batch_and_every_request_is_answered_whole(served, seed):
    rng = np.random.default_rng(seed)
    dealers = [served.dealer() for _ in range(6)]
    sent = {}
    for round_ in range(4):
        for d, dealer in enumerate(dealers):
            seq = 10 * round_ + d
            sent[seq] = (d, served.ask(dealer, seq, int(rng.integers(1, MAX_BATCH + 1))))
        answered = 0
        deadline = time.monotonic() + 10
        while answered < len(dealers):
            assert time.monotonic() < deadline, f"{len(dealers) - answered} requests unanswered"
            served.server.run_once()
            for d, dealer in enumerate(dealers):
                while (reply := served.reply(dealer, timeout_ms=0)) is not None:
                    owner, obs = sent.pop(reply.meta["seq"])
                    assert owner == d
                    assert obs.shape[0] <= reply.meta["batch_rows"] <= MAX_BATCH
                    np.testing.assert_allclose(reply.arrays["value"], obs[:, 0])
                    answered += 1
    assert not sent
    assert served.server.requests == 24 and served.server.batches > 4
    assert served.compiled == [2, 4, 8]
    assert set(served.calls) <= set(served.compiled), "a batch of a size compiled while serving"


def test_a_request_larger_than_max_batch_is_refused_and_the_next_one_served(served):
    dealer = served.dealer()
    served.ask(dealer, 1, MAX_BATCH + 1)
    served.ask(dealer, 2, 3)
    for _ in range(3):
        served.server.run_once()
    reply = served.reply(dealer)
    assert reply is not None and reply.meta["seq"] == 2 and reply.meta["batch_rows"] == 3
    assert served.reply(dealer, timeout_ms=200) is None
    assert served.server.rejects.count == 1
