"""The host agent: one peer per host for the controller (srl_jax/runtime/hosts/host_agent.py).

A real agent between a real `NameServer` (the controller's, CURVE on) and a worker's
`NetworkNameService`: what the worker registers reaches the controller, what changes
at the controller reaches the worker without a request, its heartbeats arrive batched
on the controller's stats stream, whole at first and as signs of life after. The pure
parts (which heartbeats go on whole, batches and their checks) are tested on their own.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.stream_table import INFERENCE, LOGS, ROWS, STATS
from srl_jax.runtime.backends import LocalBackend, WorkerHandle
from srl_jax.runtime.controller import Controller as RunController
from srl_jax.runtime.hosts import host_agent
from srl_jax.runtime.hosts.host_agent import (
    FULL_EVERY_S,
    Coalescer,
    HostAgent,
    agent_address,
    batches,
    sign_of_life,
    signs_of_life,
    unbatch,
)
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.name_server import NameServer
from srl_jax.runtime.worker_base import heartbeat_meta
from srl_jax.wire.codec import MAX_HEADER_BYTES, Message, decode, encode
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import CurveKeys, Transport, curve_connect

RUN_CONFIG = "name: agent-test\n"


def beat(worker: str = "actor-0", pid: int = 7, phase: str = "running",
         frames: int = 1, waiting: tuple[str, float] | None = None) -> dict:
    return heartbeat_meta(worker, "actor", 0, "default", phase, {"env_frames": frames}, [],
                          waiting, pid=pid)


def returns(*values: float) -> dict[str, np.ndarray]:
    return {"episode_return": np.array(values, np.float32),
            "episode_length": np.full(len(values), 10, np.int32)}


def test_a_heartbeat_goes_on_whole_first_then_every_period_or_when_its_phase_changes() -> None:
    coalescer = Coalescer()
    assert coalescer.take(beat(frames=1), returns(1.0), 0.0) is not None, "first: whole"
    assert coalescer.take(beat(frames=2), returns(2.0), 0.5) is None, "then a sign of life"
    assert coalescer.take(beat(frames=3), {}, 1.0) is None
    meta, arrays = coalescer.take(beat(phase="stopped", frames=4), returns(3.0), 1.2)
    assert meta["counters"]["env_frames"] == 4, "a new phase goes at once, newest counters"
    assert arrays["episode_return"].tolist() == [2.0, 3.0], "the returns that waited come too"
    assert coalescer.take(beat(phase="stopped"), {}, 1.5) is None
    assert coalescer.take(beat(phase="stopped"), {}, 1.2 + FULL_EVERY_S) is not None
    assert coalescer.take(beat(pid=8), {}, 1.6) is not None, "a successor's first is whole"


def test_a_wait_whose_since_moves_is_coalesced_and_a_new_wait_goes_whole() -> None:
    """A real actor's `since` (its oldest pending request) moves every beat: the sign of
    life carries it; what it waits on changing sends the heartbeat whole."""
    coalescer, reply = Coalescer(), "an inference reply of policy 'default'"
    assert coalescer.take(beat(waiting=(reply, 100.0)), {}, 0.0) is not None
    moved = beat(waiting=(reply, 100.5))
    assert coalescer.take(moved, {}, 0.5) is None, "only its since moved"
    assert sign_of_life(moved) == ["actor-0", 7, 100.5]
    assert sign_of_life(beat()) == ["actor-0", 7, None]
    assert coalescer.take(beat(waiting=("the sample stream", 101.0)), {}, 1.0) is not None
    assert coalescer.take(beat(), {}, 1.5) is not None, "no wait any more: whole"


def test_batches_round_trip_the_wire_and_split_under_its_header_limit() -> None:
    beats = [(beat(f"actor-{i}", frames=i), returns(float(i)) if i % 3 == 0 else {})
             for i in range(600)]
    messages = [decode(encode("stats_batch", meta, arrays))
                for meta, arrays in batches(beats, [["actor-9", 9]])]
    assert len(messages) > 1, "600 heartbeats do not fit one header"
    assert all(len(encode("stats_batch", m.meta, m.arrays)[0]) <= MAX_HEADER_BYTES
               for m in messages)
    back = [b for m in messages for b in unbatch(m)]
    assert [m["counters"]["env_frames"] for m, _ in back] == list(range(600))
    assert [a.get("episode_return", np.empty(0)).tolist() for _, a in back[:4]] == [
        [0.0], [], [], [3.0]]
    assert [s for m in messages for s in signs_of_life(m)[0]] == [["actor-9", 9, None]]
    signs = [[f"actor-{i}", i, 1.5] for i in range(2000)]
    messages = [decode(encode("stats_batch", meta, arrays))
                for meta, arrays in batches([], signs)]
    assert len(messages) > 1, "2,000 signs of life do not fit one header"
    assert [s for m in messages for s in signs_of_life(m)[0]] == signs


@pytest.mark.parametrize(("meta", "arrays", "wrong"), [
    ({"beats": "x"}, {}, "'beats' must be a list"),
    ({"beats": [{}]}, {"3/episode_return": np.zeros(1)}, "belongs to no heartbeat"),
    ({"beats": [], "alive": {"actor-0": 7}}, {}, "'alive' must be a list"),
])
def test_a_malformed_batch_is_refused(meta: dict, arrays: dict, wrong: str) -> None:
    message = Message("stats_batch", meta, arrays)
    with pytest.raises(ValueError, match=wrong):
        unbatch(message)
        signs_of_life(message)


def test_malformed_signs_of_life_are_left_out_and_counted() -> None:
    """An older agent's [worker, pid] still counts; a malformed sign costs itself only."""
    alive = [["actor-0", 7, 1.5], ["actor-1", 8], ["actor-2", "9", 1.5], ["actor-3", 9, "x"],
             "actor-4", [3, 9, None], ["actor-5", 9, None, 1], ["actor-6", True, None]]
    signs, malformed = signs_of_life(Message("stats_batch", {"beats": [], "alive": alive}, {}))
    assert signs == [["actor-0", 7, 1.5], ["actor-1", 8, None]] and malformed == 6


def test_the_controller_takes_a_hosts_batch_whole_beats_and_signs_of_life(
        tmp_path: Path) -> None:
    """The real controller's take of an agent's batches: a sign of life keeps its worker
    heard and moves status.json's `waiting_since`; a malformed one, or one of a replaced
    process, changes nothing; the metrics rows' counts see each."""
    controller = RunController(ExperimentConfig(), tmp_path, LocalBackend(tmp_path, False))
    actors = [record for record in controller.workers if record.kind == "actor"]
    for pid, record in enumerate(actors, 100):
        record.handle = WorkerHandle("actor", record.index, pid, "here", None)
    reply, coalescer = "an inference reply of policy 'default'", Coalescer()

    def take(since: float, now: float, alive: list[list] | None = None) -> None:
        beats, signs = [], list(alive or [])
        for pid, record in enumerate(actors, 100):
            meta = beat(record.name, pid, waiting=(reply, since))
            if (whole := coalescer.take(meta, {}, now)) is not None:
                beats.append(whole)
            else:
                signs.append(sign_of_life(meta))
        for meta, arrays in batches(beats, signs):
            controller._take_message(decode(encode("stats_batch", meta, arrays)))

    take(100.0, 0.0)
    first = [record.status() for record in actors]
    assert [(s["waiting_on"], s["waiting_since"]) for s in first] == [(reply, 100.0)] * len(actors)
    take(100.5, 0.5, alive=[["actor-0", 99, 7.0], ["actor-0", "100", 7.0]])
    assert [record.status()["waiting_since"] for record in actors] == [100.5] * len(actors)
    assert all(record.last_heartbeat_wall >= s["last_heartbeat"]
               for record, s in zip(actors, first, strict=True))
    assert controller.heartbeats == len(actors), "the second take: signs of life only"
    assert controller.signs_of_life == len(actors) + 1, "a replaced process's sign is taken"
    assert controller.rejects.count == 1, "the malformed sign"


class Controller:
    """The controller's side: its name server and stats stream, CURVE on."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.keys = CurveKeys.generate()
        self.transport = Transport(self.context, keys=self.keys)
        self.names = NameServer(self.transport, RUN_CONFIG)
        self.stats = make_socket(self.context, STATS.bind_type)
        self.transport.bind(self.stats, self.names, STATS.key())
        self.logs = make_socket(self.context, LOGS.bind_type)
        self.transport.bind(self.logs, self.names, LOGS.key())

    def batches(self, timeout_s: float) -> list[Message]:
        taken, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.stats.poll(50):
                taken.append(receive(self.stats, STATS.binder_receives, RejectCounter())[1])
        return taken

    def close(self) -> None:
        self.stats.close(linger=0)
        self.logs.close(linger=0)
        self.names.close()
        self.transport.close()


@pytest.fixture
def controller() -> Iterator[Controller]:
    served = Controller()
    yield served
    served.close()


def test_an_agent_stands_for_its_hosts_workers(controller: Controller) -> None:
    own = zmq.Context()  # the agent's process's: one CURVE handler (ZAP) per context
    agent = HostAgent(own, controller.names.endpoint, controller.keys,
                      agent_address(secrets.token_hex(4), "test"))
    worker = NetworkNameService(controller.context, agent.endpoint, controller.keys)
    try:
        assert worker.run_config() == RUN_CONFIG
        worker.register(INFERENCE.key(index=0), "tcp://10.0.0.1:1")
        assert controller.names.lookup(INFERENCE.key(index=0), 5) == "tcp://10.0.0.1:1"
        assert worker.lookup(STATS.key(), 5).startswith("ipc://@"), "stats go to the agent"
        followed = {INFERENCE.key(index=0): "tcp://10.0.0.1:1"}
        worker.moved(followed)  # subscribes to the agent's changes
        time.sleep(0.3)
        controller.names.register(INFERENCE.key(index=0), "tcp://10.0.0.2:2")
        deadline = time.monotonic() + 5
        while not (moved := worker.moved(followed)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert moved == {INFERENCE.key(index=0): "tcp://10.0.0.2:2"}
        controller.names.register(ROWS.key(), "tcp://10.0.0.3:3")  # a population's
        assert worker.lookup(ROWS.key(), 5) == "tcp://10.0.0.3:3", \
            "a controller stream the agent does not stand for is reached at the controller"

        stats = make_socket(controller.context, STATS.connect_type)
        curve_connect(stats, worker.lookup(STATS.key(), 5), controller.keys)
        for frames in (1, 2, 3):
            send(stats, "stats", beat(pid=os.getpid(), frames=frames, waiting=(
                "an inference reply", 100.0 + frames)), returns(float(frames)))
            time.sleep(0.3)
        taken = controller.batches(1.0)
        stats.close(linger=0)
        whole = [m for message in taken for m, _ in unbatch(message)]
        alive = [s for message in taken for s in signs_of_life(message)[0]]
        assert [m["counters"]["env_frames"] for m in whole] == [1], "the first whole"
        assert alive == [["actor-0", os.getpid(), 100.0 + frames] for frames in (2, 3)], \
            "the others as signs of life, with their waits' since"
    finally:
        worker.close()
        agent.close()
        own.destroy(linger=0)


def test_a_register_on_one_host_answers_a_lookup_waiting_on_another_at_once(
        controller: Controller, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the agents' loops waking every 30 s on their own, a worker's lookup held at its
    agent is answered as a worker on another host registers the key: the register goes on
    to the controller, and the change into the other agent's held lookup, at once."""
    monkeypatch.setattr(host_agent, "UPLINK_POLL_MS", 30_000)
    monkeypatch.setattr(host_agent, "BATCH_S", 30.0)
    run = secrets.token_hex(4)
    contexts = [zmq.Context(), zmq.Context()]
    agents = [HostAgent(own, controller.names.endpoint, controller.keys,
                        agent_address(run, f"h{i}")) for i, own in enumerate(contexts)]
    workers = [NetworkNameService(controller.context, agent.endpoint, controller.keys)
               for agent in agents]
    try:
        late = threading.Timer(0.2, workers[0].register,
                               (INFERENCE.key(index=0), "tcp://10.0.0.5:5"))
        started = time.monotonic()
        late.start()
        try:
            assert workers[1].lookup(INFERENCE.key(index=0), 20) == "tcp://10.0.0.5:5"
        finally:
            late.join()
        assert time.monotonic() - started < 5
    finally:
        for closing in (*workers, *agents):
            closing.close()
        for own in contexts:
            own.destroy(linger=0)
