"""The sending end of the parameter stream: every new version, and again now and then."""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from learners.models.param_codec import params_to_arrays
from srl_jax.wire.streams import send


class ParamPublisher:
    """Publishes parameters on a PUB socket, never blocking the learner.

    Messages carry the version and the learner's `incarnation` (its start time in
    ms), so that a restarted learner's parameters win over its predecessor's.
    """

    def __init__(self, socket: zmq.Socket, incarnation: int, log: logging.Logger) -> None:
        self.socket = socket
        self.incarnation = incarnation
        self.log = log
        self.last_publish = 0.0
        """time.monotonic() of the last publish (0: never)."""
        self.time_publish = 0.0

    def publish(self, params: Any, version: int) -> None:
        start = time.perf_counter()
        arrays = params_to_arrays(params)
        try:
            send(self.socket, "params", {"version": version, "incarnation": self.incarnation},
                 arrays, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.debug("parameter stream full; version %d not sent", version)
        self.last_publish = time.monotonic()
        self.time_publish += time.perf_counter() - start

    def republish_due(self, interval_s: float) -> bool:
        return time.monotonic() - self.last_publish > interval_s
