"""The receiving end of the parameter stream: keep the newest version, drop the rest."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import zmq

from policy.policy_runner import PolicyRunner
from srl_jax.dataflow.stream_table import PARAMS
from srl_jax.runtime.incarnation import FIRST
from srl_jax.wire.streams import RejectCounter, receive

if TYPE_CHECKING:
    from srl_jax.runtime.worker_base import Worker

POLL_MS = 100
FIRST_PARAMS_WAIT_S = 3.0


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
        newest, newest_order = None, None
        while (received := receive(self.socket, PARAMS.connecter_receives,
                                   self.rejects)) is not None:
            meta = received[1].meta
            version, incarnation = meta.get("version"), meta.get("incarnation", 0)
            if type(version) is not int or type(incarnation) is not int:
                self.rejects.reject(ValueError("params without an integer version/incarnation"))
                continue
            order = (incarnation, version)
            if self.runner.wants(version, incarnation) and (
                    newest_order is None or order > newest_order):
                newest, newest_order = received[1], order
        if newest is None:
            return
        try:
            self.runner.set_params(newest.arrays, newest_order[1], newest_order[0])
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
