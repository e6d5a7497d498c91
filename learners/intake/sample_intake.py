"""The learner's intake from the sample stream (an `Intake`, learners/intake/intake.py):
chunks, checked, counted and queued.

Each chunk must match the layout `srl_jax.dataflow.chunk_spec` gives for this run (T steps,
the columns of one actor split); anything else is counted as rejected and dropped.
Accepted chunks wait in the `SampleQueue`, which enforces the staleness cap.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from learners.training.sample_queue import SampleQueue
from srl_jax.dataflow.chunk_spec import Layout, chunk_error
from srl_jax.wire.stream_ends import Binder
from srl_jax.wire.streams import RejectCounter

MAX_DRAIN = 256
"""Chunks taken off the stream per turn at most."""
RETURN_WINDOW = 100
"""Training returns averaged to rank checkpoints for `checkpoint.keep_best`."""


def samples_waited_on(key: str, queued: int) -> str:
    """What a sample intake waits for (a learner's heartbeat says it)."""
    return f"samples on {key} ({queued} chunks queued)"


class SampleIntake:
    """Receives, checks and queues chunks; counts frames, episodes and returns."""

    kept: tuple[str, ...] = ("versions",)
    """The versions that acted each step: the learner's policy lag."""

    def __init__(self, samples: Binder, key: str, layout: Layout, queue: SampleQueue,
                 rejects: RejectCounter) -> None:
        """`samples`: its end of the sample stream (`Worker.bind`), bound under `key`."""
        self.samples = samples
        self.key = key
        self.layout = layout
        self.queue = queue
        self.rejects = rejects
        self.frames_received = 0
        self.frames_consumed = 0
        self.episodes_received = 0
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)

    def pump(self, timeout_ms: int, version: int) -> None:
        """Wait up to `timeout_ms` for chunks, then take what the stream holds (up to
        MAX_DRAIN chunks) into the queue, as received by the learner at `version`."""
        if not self.samples.wait(timeout_ms):
            return
        self.samples.rotate()
        for _ in range(MAX_DRAIN):
            received = self.samples.receive()
            if received is None:
                return
            self.take(received[1].arrays, received[1].meta, version)

    def take(self, arrays: dict[str, np.ndarray], meta: dict[str, Any], version: int) -> None:
        """One chunk and its metadata, as received while the learner is at `version`."""
        error = chunk_error(arrays, self.layout)
        if error is not None:
            self.rejects.reject(ValueError(error))
            return
        self.frames_received += arrays["rewards"][self.queue.overlap:].size
        self._take_episode_returns(meta)
        self.queue.put(arrays, version)

    def _take_episode_returns(self, meta: dict[str, Any]) -> None:
        """Training returns from a chunk's metadata (they rank checkpoints for `best`)."""
        returns = meta.get("episode_returns", [])
        if not isinstance(returns, list) or not all(
                isinstance(r, int | float) and math.isfinite(r) for r in returns):
            self.rejects.reject(ValueError("samples metadata 'episode_returns' is not a list "
                                           "of finite numbers"))
            return
        self.recent_returns.extend(float(r) for r in returns)
        self.episodes_received += len(returns)

    def forget_before(self, version: int) -> None:
        """Drop the chunks acted before `version`, queued or yet to come (counted stale)."""
        self.queue.forget_before(version)

    def take_batch(self, version: int) -> dict[str, np.ndarray] | None:
        """The next [T+1, B] batch of host arrays within the staleness cap, or None."""
        batch = self.queue.take_batch(version)
        if batch is not None:
            self.frames_consumed += batch["rewards"][self.queue.overlap:].size
        return batch

    def trained(self, kept: dict[str, np.ndarray], per_row: np.ndarray | None) -> None:
        """Nothing goes back to the actors."""

    @property
    def queued(self) -> int:
        """Chunks waiting in the queue."""
        return len(self.queue)

    def waiting_on(self) -> str:
        return samples_waited_on(self.key, len(self.queue))

    def counters(self) -> dict[str, float]:
        """Its run counters (see `srl_jax.dataflow.metrics_table.CARRIED`), all in frames."""
        return {"frames_consumed": self.frames_consumed, "frames_received": self.frames_received,
                "episodes_received": self.episodes_received,
                "samples_dropped_stale": self.queue.dropped_stale,
                "samples_dropped_full": self.queue.dropped_full}

    def restore(self, counters: dict[str, float], recent_returns: list[float]) -> None:
        """Continue the counters (and the returns window) of a checkpoint."""
        self.frames_consumed = int(counters["frames_consumed"])
        self.frames_received = int(counters["frames_received"])
        self.episodes_received = int(counters["episodes_received"])
        self.queue.dropped_stale = int(counters["samples_dropped_stale"])
        self.queue.dropped_full = int(counters["samples_dropped_full"])
        self.recent_returns.extend(recent_returns)

    def close(self) -> None:
        self.samples.close()
