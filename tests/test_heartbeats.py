"""The heartbeat stream is bounded: a controller that falls behind costs heartbeats, not
worker memory, and the episode returns of skipped heartbeats arrive with a later one.
A worker busy in slow device work heartbeats from a helper thread, up to a bound."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from actors.actor_core import ActionRequest, Turn
from actors.actor_worker import ActorWorker
from policy import evaluator as evaluator_module
from policy.evaluator import EvaluatorWorker
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.stream_table import INFERENCE, STATS
from srl_jax.dataflow.worker_kinds import PARENT_ENV
from srl_jax.runtime.worker_base import Worker
from srl_jax.wire.names import FileNameService
from srl_jax.wire.stream_ends import Connecter
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send

QUEUE = 2


class ReturnsWorker(Worker):
    """A worker that finishes one episode (its return: a running number) per heartbeat."""

    kind = "actor"

    def __init__(self, config: ExperimentConfig, run_dir: Path) -> None:
        super().__init__(config, 0, run_dir, FileNameService(run_dir / "names"))
        self.unsent: list[float] = []

    def stats_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"episode_return": np.asarray(self.unsent, np.float32)}
        self.unsent = []
        return arrays


def test_a_controller_that_does_not_read_costs_heartbeats_not_returns(tmp_path: Path) -> None:
    config = ExperimentConfig()
    config.runtime.stats_queue = QUEUE
    controller = make_socket(zmq.Context.instance(), STATS.bind_type, hwm=QUEUE)
    controller.bind("inproc://test-heartbeats")  # inproc: the bound is exactly both HWMs
    FileNameService(tmp_path / "names").register(STATS.key(), "inproc://test-heartbeats")
    worker = ReturnsWorker(config, tmp_path)
    try:
        worker.connect_stats()
        finished = 0
        while not worker.unsent or len(worker.unsent) < 10:
            finished += 1
            worker.unsent.append(float(finished))
            worker.heartbeat(force=True)
            assert finished < 1000, "the stream never filled: it is not bounded"
        assert len(worker.unsent) == 10, "returns of skipped heartbeats are kept"
        received, rejects = [], RejectCounter()
        while (message := receive(controller, STATS.binder_receives, rejects)) is not None:
            received.append(message[1])
        assert len(received) <= 2 * QUEUE + 1, f"{len(received)} heartbeats were queued"
        worker.heartbeat(force=True)
        received.append(receive(controller, STATS.binder_receives, rejects)[1])
        returns = np.concatenate([m.arrays["episode_return"] for m in received])
        np.testing.assert_array_equal(returns, np.arange(1, finished + 1, dtype=np.float32))
        assert rejects.count == 0
    finally:
        worker._stats_socket.close(linger=0)
        controller.close(linger=0)


def _stats_pair(tmp_path: Path, config: ExperimentConfig, name: str,
                worker: Worker | None = None) -> tuple[zmq.Socket, Worker]:
    """A controller's end of the stats stream and `worker` (a ReturnsWorker if none)
    connected to it, past the heartbeat the connecting sends."""
    controller = make_socket(zmq.Context.instance(), STATS.bind_type, hwm=1000)
    controller.bind(f"inproc://{name}")
    FileNameService(tmp_path / "names").register(STATS.key(), f"inproc://{name}")
    worker = worker or ReturnsWorker(config, tmp_path)
    worker.connect_stats()
    assert controller.poll(1000)
    receive(controller, STATS.binder_receives, RejectCounter())  # the one connecting sends
    return controller, worker


def _heartbeats(controller: zmq.Socket) -> list[dict]:
    metas = []
    while (message := receive(controller, STATS.binder_receives, RejectCounter())) is not None:
        metas.append(message[1].meta)
    return metas


def test_a_worker_busy_in_device_work_heartbeats_and_says_what_it_does(tmp_path: Path) -> None:
    config = ExperimentConfig()
    config.runtime.stats_interval_s = 0.05
    controller, worker = _stats_pair(tmp_path, config, "test-busy")
    try:
        with worker.busy("compiling the update"):
            time.sleep(1.0)  # releases the GIL, as an XLA compile or a device wait does
            during = _heartbeats(controller)
        assert len(during) >= 10, "heartbeats went on while the main thread was blocked"
        assert all(meta["waiting"][0] == "compiling the update" for meta in during)
        worker.heartbeat(force=True)
        assert _heartbeats(controller)[-1]["waiting"] is None
    finally:
        worker._stats_socket.close(linger=0)
        controller.close(linger=0)


def test_busy_heartbeats_end_at_the_bound_so_a_stuck_worker_is_still_killed(
        tmp_path: Path) -> None:
    config = ExperimentConfig()
    config.runtime.stats_interval_s = 0.05
    config.runtime.busy_timeout_s = 0.3
    controller, worker = _stats_pair(tmp_path, config, "test-busy-bound")
    try:
        with worker.busy("updating"):
            time.sleep(0.5)
            _heartbeats(controller)
            time.sleep(0.5)
            assert _heartbeats(controller) == [], "silent past runtime.busy_timeout_s"
    finally:
        worker._stats_socket.close(linger=0)
        controller.close(linger=0)


class BuildingStopped(Exception):
    """Ends an evaluator's setup once its policies are built (nothing to subscribe to here)."""


def test_an_evaluator_heartbeats_while_it_builds_its_policies(tmp_path: Path,
                                                               monkeypatch) -> None:
    """Building a policy is XLA work that a cold compilation cache and a loaded CPU can
    stretch past the heartbeat timeout: the evaluator was killed at start for it."""
    config = ExperimentConfig()
    config.runtime.stats_interval_s = 0.05
    config.runtime.compilation_cache_dir = ""  # this process keeps the suite's cache
    evaluator = EvaluatorWorker(config, 0, tmp_path, FileNameService(tmp_path / "names"))
    controller, _ = _stats_pair(tmp_path, config, "test-evaluator-busy", evaluator)
    seen: list[dict] = []

    def slow_build(*args, **kwargs):
        time.sleep(0.5)  # releases the GIL, as a compile does
        seen.extend(_heartbeats(controller))
        raise BuildingStopped

    monkeypatch.setattr(evaluator_module, "make_runner", slow_build)
    try:
        with pytest.raises(BuildingStopped):
            evaluator.setup()
        assert len(seen) >= 5, "heartbeats went on while the policies were built"
        assert all(meta["waiting"][0] == "building the policies it evaluates" for meta in seen)
    finally:
        evaluator._stats_socket.close(linger=0)
        controller.close(linger=0)


class FramesWorker(Worker):
    """An actor-kind worker whose env_frames counter is set by the test."""

    kind = "actor"

    def __init__(self, config: ExperimentConfig, run_dir: Path) -> None:
        super().__init__(config, 0, run_dir, FileNameService(run_dir / "names"))
        self.env_frames = 0

    def counters(self) -> dict[str, float]:
        return {"env_frames": self.env_frames}


def test_the_first_env_frame_is_heartbeaten_at_once_and_only_once(tmp_path: Path) -> None:
    """So the controller times the run's first frame to a loop turn (status.json startup)."""
    worker = FramesWorker(ExperimentConfig(), tmp_path)
    assert not worker._first_progress()
    worker.env_frames = 64
    assert worker._first_progress()
    worker.env_frames = 128
    assert not worker._first_progress()


def test_a_worker_whose_starter_died_before_it_looked_stops_at_its_first_heartbeat(
        tmp_path: Path, monkeypatch) -> None:
    """A worker orphaned while it still imported (its parent pid already 1 when it looks)
    knows its starter from PARENT_ENV, so it does not take its new parent for it."""
    monkeypatch.setenv(PARENT_ENV, str(os.getppid() + 1_000_000))  # not this parent
    orphan = ReturnsWorker(ExperimentConfig(), tmp_path)
    orphan.heartbeat(force=True)
    assert orphan.stopping
    monkeypatch.setenv(PARENT_ENV, str(os.getppid()))
    started_here = ReturnsWorker(ExperimentConfig(), tmp_path)
    started_here.heartbeat(force=True)
    assert not started_here.stopping


class SlowEnvCore:
    """An actor core whose splits step slower than their server answers: each request
    sent is answered at once (as by a fast inference server), and each step takes 20 ms,
    so after every reply another is already waiting."""

    def __init__(self, server: zmq.Socket, splits: int) -> None:
        self.server, self.splits, self.replies = server, [None] * splits, 0

    def on_reply(self, policy: int, meta: dict, arrays: dict[str, np.ndarray]) -> Turn:
        self.replies += 1
        assert self.replies <= 10 * len(self.splits), "the turn never ended"
        time.sleep(0.02)
        return Turn(requests=[ActionRequest(meta["split"], policy, meta["seq"] + 1, {})])

    def sent(self, request: ActionRequest, delivered: bool) -> None:
        assert delivered and self.server.poll(1000)
        routing, message = receive(self.server, INFERENCE.binder_receives, RejectCounter(),
                                   envelope=1)
        send(self.server, "infer_reply", message.meta, {}, routing=routing)

    def overdue(self) -> list:
        return []


def test_an_actor_whose_envs_step_slower_than_its_server_answers_ends_each_turn(
        tmp_path: Path) -> None:
    """A turn of the actor's loop takes at most one reply per split, then heartbeats."""
    context = zmq.Context.instance()
    server, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}")
    actor = ActorWorker(ExperimentConfig(), 0, tmp_path, FileNameService(tmp_path / "names"))
    actor.core = core = SlowEnvCore(server, splits=2)
    actor.inference = [Connecter(dealer, "infer_request", INFERENCE.connecter_receives,
                                 actor.rejects)]
    actor.inference[0].register(actor.poller)
    try:
        for split in range(2):
            actor._send_request(ActionRequest(split, 0, 0, {}))
        actor.run_once()
        assert core.replies == 2, "one reply per split, the next ones left for a turn"
        actor.run_once()
        assert core.replies == 4
    finally:
        dealer.close(linger=0)
        server.close(linger=0)
