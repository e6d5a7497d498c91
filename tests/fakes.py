"""Peers a test plays for a real actor process: the inference server and the learner."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zmq

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.stream_table import INFERENCE, SAMPLES
from srl_jax.wire.codec import Message
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, make_socket, receive
from srl_jax.wire.transport import Transport


class FakeServerAndLearner:
    """An inference server 0 (ROUTER) and a learner process 0 (PULL) of `policy`.

    Subclasses decide how to `answer` each request; chunks are collected.
    """

    def __init__(self, run_dir: Path, policy: str = DEFAULT_POLICY) -> None:
        names = FileNameService(run_dir / "names")
        context = zmq.Context.instance()
        loopback = Transport(context)
        self.router = make_socket(context, INFERENCE.bind_type)
        loopback.bind(self.router, names, INFERENCE.key(policy, 0))
        self.pull = make_socket(context, SAMPLES.bind_type)
        loopback.bind(self.pull, names, SAMPLES.key(policy, 0))
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.pull, zmq.POLLIN)
        self.rejects = RejectCounter()
        self.replies = 0
        self.chunks: list[dict[str, np.ndarray]] = []
        self.chunk_meta: list[dict] = []

    def answer(self, routing: list[bytes], message: Message) -> None:
        raise NotImplementedError

    def serve(self, until: Callable[[], bool], timeout: float) -> None:
        """Answer requests and collect chunks until `until()` or fail after `timeout`."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, (
                f"timed out: {self.replies} replies, {len(self.chunks)} chunks")
            self.serve_once()

    def serve_once(self, poll_ms: int = 100) -> None:
        """Answer the requests and collect the chunks that arrive within `poll_ms`."""
        events = dict(self.poller.poll(poll_ms))
        if self.router in events:
            while (got := receive(self.router, INFERENCE.binder_receives,
                                  self.rejects, envelope=1)) is not None:
                self.answer(*got)
        if self.pull in events:
            while (got := receive(self.pull, SAMPLES.binder_receives,
                                  self.rejects)) is not None:
                self.chunks.append({k: v.copy() for k, v in got[1].arrays.items()})
                self.chunk_meta.append(dict(got[1].meta))

    def close(self) -> None:
        self.router.close()
        self.pull.close()
