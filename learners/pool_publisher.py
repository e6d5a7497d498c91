"""The learner's side of self-play: keep the opponent pool and publish it on the pool stream.

A learner whose policy frozen policies play (`selfplay.opponents`) adds a snapshot
of its parameters to its `SnapshotPool` every `selfplay.snapshot_every` versions
and sends it at once; every `learner.republish_interval_s` it sends one snapshot
again, each in turn, so that a server that joined late (or was restarted) holds the
whole pool after `selfplay.pool` intervals. Every message lists the versions the
pool holds, so servers drop the snapshots it no longer does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from learners.models.param_codec import params_to_arrays
from srl_jax.config.opponent_pool import SnapshotPool
from srl_jax.wire.streams import send


class PoolPublisher:
    """A policy's opponent pool, kept from its parameters and sent on a PUB socket."""

    def __init__(self, socket: zmq.Socket, pool: SnapshotPool, started_ms: int,
                 interval_s: float, log: logging.Logger) -> None:
        """`started_ms`: the learner's start time, as its parameter messages carry it."""
        self.socket = socket
        self.pool = pool
        self.started_ms = started_ms
        self.interval_s = interval_s
        self.log = log
        self._last_send = 0.0

    def start(self, version: int, params: Any) -> None:
        """Take the saved snapshots up to the learner's `version` (restored or 0), keep
        `params` if due, and send the whole pool."""
        self.pool.load(version)
        self.keep(version, params)
        for held in self.pool.versions:
            self._send(held)
        self.log.info("opponent pool: versions %s", self.pool.versions)

    def keep(self, version: int, params: Any) -> None:
        """Add `params` as snapshot `version` if it is one to keep, and send it."""
        if self.pool.due(version):
            self.pool.add(version, params_to_arrays(params))
            self._send(version)

    def republish(self) -> None:
        """Send the next snapshot again once `interval_s` has passed since the last send."""
        if time.monotonic() - self._last_send > self.interval_s:
            version = self.pool.next_to_republish()
            if version is not None:
                self._send(version)

    def _send(self, version: int) -> None:
        meta = {"version": version, "started_ms": self.started_ms,
                "pool": self.pool.versions}
        try:
            send(self.socket, "snapshot", meta, self.pool.snapshots[version], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.debug("pool stream full; snapshot %d not sent", version)
        self._last_send = time.monotonic()
