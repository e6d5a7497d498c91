"""The learner's sample queue: bounded, drop-oldest, with the staleness cap.

Pure Python and numpy so the policy can be tested without a learner. Chunks
arrive as dicts of [T(+1), n] arrays with per-step `versions`; a batch is the
first chunks that fill B env columns, concatenated on the env axis.

The drop counters count frames (env steps: T x columns of each dropped chunk), the
unit of `learner/samples_per_s`; the capacity counts chunks.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class SampleQueue:
    def __init__(self, capacity: int, batch_envs: int, staleness_cap: int,
                 overlap: int = 0) -> None:
        """`overlap`: steps each chunk repeats of the one before (burn-in), which the
        drop counters do not count again."""
        self.capacity = capacity
        self.overlap = overlap
        self.floor = 0
        """Chunks acted before this version are stale (`forget_before`)."""
        self.batch_envs = batch_envs
        self.staleness_cap = staleness_cap
        self._chunks: deque[dict[str, np.ndarray]] = deque()
        self._columns = 0
        self.dropped_stale = 0
        """Frames dropped by the staleness cap."""
        self.dropped_full = 0
        """Frames dropped, oldest first, to keep at most `capacity` chunks."""

    def __len__(self) -> int:
        return len(self._chunks)

    def _is_stale(self, chunk: dict[str, np.ndarray], version: int) -> bool:
        """Too old, acted by versions a learner restored from a checkpoint never made, or
        by parameters a copy replaced (`forget_before`)."""
        versions = chunk["versions"]
        return version - int(versions.min()) > self.staleness_cap or \
            int(versions.max()) > version or int(versions.min()) < self.floor

    def forget_before(self, version: int) -> None:
        """From now on, chunks acted before `version` are stale: the queued ones go now."""
        self.floor = version
        self._drop_stale(version)

    def _drop_stale(self, version: int) -> None:
        """Drop (and count) the queued chunks stale for a learner at `version`."""
        kept: deque[dict[str, np.ndarray]] = deque()
        for chunk in self._chunks:
            if self._is_stale(chunk, version):
                self.dropped_stale += chunk["rewards"][self.overlap:].size
            else:
                kept.append(chunk)
        self._chunks = kept
        self._columns = sum(c["actions"].shape[1] for c in kept)

    def put(self, chunk: dict[str, np.ndarray], version: int) -> None:
        """Add a chunk unless it is already stale; drop the oldest when full."""
        if self._is_stale(chunk, version):
            self.dropped_stale += chunk["rewards"][self.overlap:].size
            return
        if len(self._chunks) >= self.capacity:
            oldest = self._chunks.popleft()
            self._columns -= oldest["actions"].shape[1]
            self.dropped_full += oldest["rewards"][self.overlap:].size
        self._chunks.append(chunk)
        self._columns += chunk["actions"].shape[1]

    def take_batch(self, version: int) -> dict[str, np.ndarray] | None:
        """A [T(+1), B] batch of chunks within the staleness cap, or None if too few."""
        self._drop_stale(version)
        if self._columns < self.batch_envs:
            return None
        taken, columns = [], 0
        while columns < self.batch_envs:
            chunk = self._chunks.popleft()
            taken.append(chunk)
            columns += chunk["actions"].shape[1]
        self._columns -= columns
        return {key: np.concatenate([c[key] for c in taken], axis=1) for key in taken[0]}
