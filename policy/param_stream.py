"""The parameter stream, both ends: the learner publishes every new version, and again now
and then for late joiners (`ParamPublisher`); a subscriber keeps the newest version and
drops the rest (`ParamSubscriber`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from learners.models.param_codec import params_to_arrays
from policy.policy_runner import PolicyRunner
from srl_jax.dataflow.stream_table import PARAMS
from srl_jax.runtime.incarnation import FIRST
from srl_jax.wire.codec import Message
from srl_jax.wire.streams import RejectCounter, receive, send

if TYPE_CHECKING:
    from srl_jax.runtime.worker_base import Worker

POLL_MS = 100
FIRST_PARAMS_WAIT_S = 3.0


class ParamPublisher:
    """Publishes parameters on a PUB socket, never blocking the learner.

    Messages carry the version and the learner's start time in ms (`started_ms`), so
    that a restarted learner's parameters win over its predecessor's.
    """

    def __init__(self, socket: zmq.Socket, started_ms: int, log: logging.Logger) -> None:
        self.socket = socket
        self.started_ms = started_ms
        self.log = log
        self.last_publish = 0.0
        """time.monotonic() of the last publish (0: never)."""
        self.time_publish = 0.0

    def publish(self, params: Any, version: int) -> None:
        start = time.perf_counter()
        arrays = params_to_arrays(params)
        try:
            send(self.socket, "params", {"version": version, "started_ms": self.started_ms},
                 arrays, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.debug("parameter stream full; version %d not sent", version)
        self.last_publish = time.monotonic()
        self.time_publish += time.perf_counter() - start

    def republish_due(self, interval_s: float) -> bool:
        return time.monotonic() - self.last_publish > interval_s


class Subscriber(Protocol):
    """A SUB socket that feeds what acts with the parameters it brings (`ParamSubscriber`,
    `policy.pool_runner.PoolSubscriber`)."""

    socket: zmq.Socket

    @property
    def taken(self) -> bool:
        """Whether it has fed any parameters yet."""

    def poll(self) -> None:
        """Take what is waiting on the socket."""


class ParamSubscriber:
    """Feeds a `PolicyRunner` from a SUB socket connected to the learner."""

    def __init__(self, socket: zmq.Socket, runner: PolicyRunner, rejects: RejectCounter) -> None:
        self.socket = socket
        self.runner = runner
        self.rejects = rejects

    def poll(self) -> None:
        """Take the newest waiting parameters, if newer than the runner's."""
        newest: tuple[tuple[int, int], Message] | None = None  # ((started_ms, version), it)
        while (received := receive(self.socket, PARAMS.connecter_receives,
                                   self.rejects)) is not None:
            meta = received[1].meta
            version, started_ms = meta.get("version"), meta.get("started_ms", 0)
            if type(version) is not int or type(started_ms) is not int:
                self.rejects.reject(ValueError("params without an integer version/started_ms"))
                continue
            order = (started_ms, version)
            if self.runner.wants(version, started_ms) and (newest is None or order > newest[0]):
                newest = order, received[1]
        if newest is None:
            return
        (started_ms, version), message = newest
        try:
            self.runner.set_params(message.arrays, version, started_ms)
        except ValueError as error:
            self.rejects.reject(error)

    @property
    def taken(self) -> bool:
        return self.runner.updates > 0


def await_first(subscriber: Subscriber, timeout_s: float, keep_alive: Callable[[], bool]
                ) -> None:
    """Wait up to `timeout_s` for the first parameters `subscriber` takes; `keep_alive`
    heartbeats and returns False when the worker should stop."""
    deadline = time.monotonic() + timeout_s
    while not subscriber.taken and time.monotonic() < deadline and keep_alive():
        if subscriber.socket.poll(POLL_MS):
            subscriber.poll()


def subscribe(worker: Worker, runner: PolicyRunner, policy: str | None = None
              ) -> ParamSubscriber:
    """Connect `worker` to the parameters of `policy`'s learner (default: the worker's
    policy); a restarted or resumed worker takes the current ones if they come within
    FIRST_PARAMS_WAIT_S: it would otherwise act with version 0 until the next
    republish, and its samples would all be dropped as stale.

    The first start of a fresh run does not wait: its learner starts from version 0,
    the parameters every worker builds from the seed, so acting with them at once
    loses nothing and the first frames come as soon as the worker is up. Nor does a
    runner that holds only the parameters' shapes (an inference server's): it cannot act
    before its learner's anyway, and its worker waits for them once it is ready to serve.
    """
    socket = worker.socket(PARAMS, policy, hwm=worker.config.learner.param_queue)
    subscriber = ParamSubscriber(socket, runner, worker.rejects)
    if worker.incarnation != FIRST and runner.ready:
        await_first(subscriber, FIRST_PARAMS_WAIT_S, worker.keep_alive)
    return subscriber
