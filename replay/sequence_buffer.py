"""Recurrent replay (R2D2, Kapturowski et al. 2019): whole chunk columns sampled as sequences.

The storage is `ReplayBuffer`'s (replay/buffer.py): each chunk column is a segment of T
steps with its T + 1 observations, and here also the recurrent state its actor acted
from at the first step (R2D2's stored state). What differs is the unit: a segment is
one leaf of the sum tree, sampled whole, and its priority is the one the learner
computed over the sequence (eta * max + (1 - eta) * mean of its TD errors). The
actors' chunks overlap as the algorithm declares (`Sizes.overlap`; R2D2: all but
`learner.r2d2.period` steps), so consecutive sequences of a column start `period` steps
apart as R2D2's do, each with its burn-in as a prefix.

A new sequence enters at the largest priority seen so far.

For a policy that searches (MuZero) a segment also keeps what trains it besides the
steps: the search's policy at each step, the policy head's target (MuZero samples
positions of them: replay/position_buffer.py). Its value targets bootstrap from the
learner's target network, so no search value is stored.
"""

from __future__ import annotations

import numpy as np

from replay.buffer import ReplayBuffer
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import replay_layout


class SequenceBuffer(ReplayBuffer):
    def __init__(self, capacity: int, trajectory_length: int, columns: int, spec: EnvSpec,
                 frame_stack: int, priority_exponent: float, importance_exponent: float,
                 seed: int, kept: tuple[str, ...] = ()) -> None:
        super().__init__(capacity, trajectory_length, columns, spec, frame_stack,
                         priority_exponent, importance_exponent, seed, kept)
        width = spec.action_dim if spec.search_policy else 0
        self.search_policy = np.zeros((self.segments, self.T, width), np.float32)
        """The search's policy at each step (width 0: a policy that does not search)."""

    @property
    def stored_fields(self) -> tuple[str, ...]:
        return (*super().stored_fields, "search_policy")

    def _final_obs(self, segment: np.ndarray, step: np.ndarray) -> np.ndarray:
        """The final observations stored at (segment, step), or rows of width 0."""
        if self.final_obs is None:
            return np.zeros((*np.broadcast_shapes(segment.shape, step.shape), 0),
                            self.spec.obs_dtype)
        return self.final_obs[segment, step]

    @property
    def leaves_per_segment(self) -> int:
        """Sampled items per segment: the segment itself."""
        return 1

    @property
    def sequences(self) -> bool:
        return True

    @property
    def sampled_window(self) -> int | None:
        return self.T

    @property
    def steps_per_item(self) -> int:
        return self.T

    def _initial_priorities(self, chunk: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """A sequence is active where any of its steps is; it starts at the largest
        priority seen (a per-step TD error of the actor's does not make a sequence's)."""
        active = np.any(chunk["active"], axis=0)
        return active, np.full(len(active), self.max_priority)

    def _draw(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, segments, first steps) of `rows` items drawn by priority."""
        slots = self.tree.sample(rows, self.rng)
        per = self.leaves_per_segment
        return slots, slots // per, slots % per

    def sample(self, rows: int, window: int) -> dict[str, np.ndarray]:
        """`rows` items drawn by priority, each with the `window` steps from its first (a
        whole sequence here: its T; `sampled_window` says which a subclass carries)."""
        if window != self.sampled_window:
            raise ValueError(f"sampled rows are {self.sampled_window} steps, not {window}")
        if not self.live.any():
            raise ValueError("sample from an empty replay buffer")
        slots, segment, start = self._draw(rows)
        probabilities = self.tree.values(slots) / self.tree.total
        at = segment[:, None]
        steps = start[:, None] + np.arange(window)[None, :]
        obs_steps = start[:, None] + np.arange(window + 1)[None, :]
        out = {
            "obs": self._observations(at, obs_steps),
            "actions": self.actions[at, steps],
            "rewards": self.rewards[at, steps],
            "terminated": self.terminated[at, steps],
            "truncated": self.truncated[at, steps],
            "trunc_values": self.trunc_values[at, steps],
            "search_policy": self.search_policy[at, steps],
            "final_obs": self._final_obs(at, steps),
            "state": self.states[segment],
            "weights": (self.items * probabilities) ** -self.beta,
            "probabilities": probabilities,
            "slots": slots,
            "generations": self.generations[segment],
            **{name: store[at, obs_steps if store.shape[1] == self.T + 1 else steps]
               for name, store in self.kept.items()},
        }
        layout = replay_layout(rows, window, self.spec, self.fields)
        return {name: out[name].astype(dtype, copy=False) for name, (_, dtype) in layout.items()}
