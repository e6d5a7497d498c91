"""Stacked observations stored one frame each: a ring of frames addressed by serial.

An Atari observation stacks the last K frames on its last axis, so consecutive
observations of an episode share K - 1 frames. `FrameStore.add` takes a chunk's
observations of many columns, finds where each one continues the previous one
(its first K - 1 frames are the previous one's last K - 1: compared exactly, so a
reset or any mismatch stores the whole stack) and stores only the new frames; it
returns per observation the serials of its K frames. A serial is a frame's
insert count: serial s lives at s % capacity until `capacity` later frames
overwrite it, which `oldest` tells.
"""

from __future__ import annotations

import numpy as np


class FrameStore:
    def __init__(self, capacity: int, frame_shape: tuple[int, ...], dtype: np.dtype,
                 stack: int) -> None:
        self.capacity = capacity
        self.stack = stack
        self.frames = np.zeros((capacity, *frame_shape), dtype)
        self.next_serial = 0

    @property
    def oldest(self) -> int:
        """Serials below this have been overwritten."""
        return max(0, self.next_serial - self.capacity)

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes

    def _write(self, frames: np.ndarray) -> np.ndarray:
        serials = self.next_serial + np.arange(len(frames), dtype=np.int64)
        self.frames[serials % self.capacity] = frames
        self.next_serial += len(frames)
        return serials

    def add(self, obs: np.ndarray) -> np.ndarray:
        """Store observations [T, n, *frame_shape, K]; returns serials [n, T, K].

        Each column's first observation is stored whole; later ones add one frame
        where they continue the one before.
        """
        T, n, K = obs.shape[0], obs.shape[1], self.stack
        stacks = np.ascontiguousarray(np.moveaxis(obs, -1, 2))  # [T, n, K, *frame_shape]
        flat = stacks.reshape(T, n, K, -1)  # contiguous: compared 50x faster than strided
        continues = ~(flat[1:, :, :-1] != flat[:-1, :, 1:]).any(axis=(2, 3))  # [T-1, n]
        serials = np.empty((n, T, K), np.int64)
        serials[:, 0] = self._write(stacks[0].reshape(n * K, *stacks.shape[3:])).reshape(n, K)
        for t in range(1, T):
            whole = ~continues[t - 1]
            serials[:, t, :-1] = serials[:, t - 1, 1:]
            serials[~whole, t, -1] = self._write(stacks[t, ~whole, -1])
            if whole.any():
                fresh = stacks[t, whole]
                serials[whole, t] = self._write(
                    fresh.reshape(-1, *fresh.shape[2:])).reshape(-1, K)
        return serials

    def gather(self, serials: np.ndarray) -> np.ndarray:
        """Observations [..., *frame_shape, K] from serials [..., K] (none overwritten)."""
        return np.moveaxis(self.frames[serials % self.capacity], serials.ndim - 1, -1)
