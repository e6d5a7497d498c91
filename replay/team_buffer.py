"""Team replay (QMIX): the sequences of one env's agents stored, prioritised and sampled
together.

A multi-agent chunk's columns are env-major: agent k of env e is column e * n + k
(actors/env_families/multi_agent.py). Stored as `SequenceBuffer` stores them, a chunk's
columns take consecutive segments, and with a ring of a multiple of n segments each
team's n sequences stay side by side: segments t * n .. t * n + n - 1. A team is one
item: its first segment's leaf holds the team's priority (the others' hold 0, so they
are never drawn alone), and a draw brings all n sequences as n consecutive rows, each
carrying the team's slot, probability and weight. The learner sends one priority per
row, its team's for every agent row, so an update sets the team's leaf.
"""

from __future__ import annotations

import numpy as np

from replay.sequence_buffer import SequenceBuffer
from srl_jax.dataflow.env_spec import EnvSpec


class TeamBuffer(SequenceBuffer):
    def __init__(self, capacity: int, trajectory_length: int, columns: int, spec: EnvSpec,
                 frame_stack: int, priority_exponent: float, importance_exponent: float,
                 seed: int, kept: tuple[str, ...] = ()) -> None:
        n = spec.agents
        if columns % n:
            raise ValueError(f"chunks of {columns} columns do not hold whole teams of {n}")
        # whole teams in the ring: capacity rounded down to a multiple of n sequences
        teams = max(capacity // (trajectory_length * n), columns // n)
        super().__init__(teams * n * trajectory_length, trajectory_length, columns, spec,
                         frame_stack, priority_exponent, importance_exponent, seed, kept)

    @property
    def items(self) -> int:
        """Teams that can be sampled (the N of the importance weights)."""
        return int(self.live.sum()) // self.spec.agents

    def _initial_priorities(self, chunk: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """A team is active where any of its agents' steps is; its first sequence carries
        the team's priority, the largest seen."""
        n = self.spec.agents
        played = np.any(chunk["active"], axis=0).reshape(-1, n).any(-1)
        active = np.zeros((len(played), n), bool)
        active[:, 0] = played
        return active.reshape(-1), np.full(active.size, self.max_priority)

    def _draw(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Whole teams: `rows` / n of them drawn by priority, each as its n sequences."""
        n = self.spec.agents
        if rows % n:
            raise ValueError(f"{rows} rows are not whole teams of {n} agents")
        leaders = self.tree.sample(rows // n, self.rng)
        segments = (leaders[:, None] + np.arange(n)).reshape(-1)
        return np.repeat(leaders, n), segments, np.zeros(rows, np.int64)
