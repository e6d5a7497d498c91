"""MuZero's replay (Schrittwieser et al. 2020, appendix G): single positions sampled by
their own priority from sequences stored whole.

A chunk column is stored as one segment of T steps, as `SequenceBuffer` stores it, but
the unit sampled is a position: one of the segment's first P = T - tail steps, each a
leaf of the sum tree with its own priority |v - z| (the learner's), raised to
`replay.priority_exponent` (MuZero: 1) and weighted by `replay.importance_exponent`
(MuZero: 1). The actors repeat a chunk's last `tail` steps at the start of the next one
(`Algorithm.overlap`), so every step is a sampled position of exactly one segment and
every position has its `window` steps after it in the same segment: a K-step unroll with
n-step targets at each of its steps is never cut by a chunk's end, only by an episode's.

A sampled row is that window: the sequence fields (`SEQUENCE_FIELDS`) of `window` steps
from the position, with their `window` + 1 observations. A new position enters at the
largest priority seen so far.
"""

from __future__ import annotations

import numpy as np

from replay.sequence_buffer import SequenceBuffer
from srl_jax.dataflow.env_spec import EnvSpec


class PositionBuffer(SequenceBuffer):
    def __init__(self, capacity: int, trajectory_length: int, columns: int, spec: EnvSpec,
                 frame_stack: int, priority_exponent: float, importance_exponent: float,
                 seed: int, kept: tuple[str, ...] = (), *, positions: int,
                 window: int) -> None:
        """`positions` P: the sampled steps at the start of each segment; `window`: the steps
        a sampled row carries from its position (P - 1 + window <= T)."""
        if not 1 <= positions <= trajectory_length - window + 1:
            raise ValueError(f"{positions} positions with windows of {window} steps do not "
                             f"fit segments of {trajectory_length}")
        self.positions, self.window = positions, window
        super().__init__(capacity, trajectory_length, columns, spec, frame_stack,
                         priority_exponent, importance_exponent, seed, kept)

    @property
    def leaves_per_segment(self) -> int:
        """Sampled items per segment: its first P steps."""
        return self.positions

    @property
    def sampled_window(self) -> int:
        return self.window

    @property
    def steps_per_item(self) -> int:
        return 1

    def insert(self, chunk: dict[str, np.ndarray]) -> int:
        """Store the chunk's columns; returns the positions added (the steps the chunk
        adds to the run, its tail being the next chunk's)."""
        super().insert(chunk)
        return chunk["actions"].shape[1] * self.positions

    def _initial_priorities(self, chunk: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """A position is active where its step is; it starts at the largest priority seen."""
        active = np.swapaxes(chunk["active"][:self.positions], 0, 1).reshape(-1).astype(bool)
        return active, np.full(len(active), self.max_priority)

    def refresh(self, slots: np.ndarray, generations: np.ndarray,
                search_policy: np.ndarray) -> int:
        """Replace the search policies [n, k, A] of the first k steps of sampled rows'
        windows with a newer search's; a segment overwritten since keeps its successor's.
        Returns how many rows were replaced."""
        segment, start = slots // self.positions, slots % self.positions
        current = (self.generations[segment] == generations) & self.live[segment]
        steps = start[current, None] + np.arange(search_policy.shape[1])[None, :]
        self.search_policy[segment[current, None], steps] = search_policy[current]
        return int(current.sum())
