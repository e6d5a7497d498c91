"""One replay server's storage: chunk columns in a fixed ring, sampled by priority.

Each column of an inserted chunk becomes one segment of T transitions and its
T + 1 observations (the last is the bootstrap of the column's last windows), so
an n-step window never leaves its segment: it stops at the end of an episode or
of the segment. Segments fill a ring of `capacity // T` preallocated slots, the
oldest overwritten first; the memory is allocated once, at construction, and
`nbytes` reports it. Frame-stacked observations are stored one frame each
(`FrameStore`); a segment whose frames were overwritten before the segment
itself is dropped from sampling.

Transition i = segment * T + t is a leaf of a `SumTree` holding priority ** alpha
(`SequenceBuffer`, replay/sequence_buffer.py, makes each segment one leaf instead);
a new transition gets the priority its actor computed where the chunk carries them
(Ape-X, actors/priorities.py), else the largest priority seen so far (Schaul et al.
2016), so that every transition is likely to be sampled once before its TD error is
known.
A sampled row carries its slot and its segment's generation (its insert count),
so a priority update for a slot overwritten since is recognised and ignored.
"""

from __future__ import annotations

import numpy as np

from replay.frame_store import FrameStore
from replay.sum_tree import SumTree
from srl_jax.dataflow.chunk_spec import CHUNK_FIELDS
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import replay_fields, replay_layout


class ReplayBuffer:
    def __init__(self, capacity: int, trajectory_length: int, columns: int, spec: EnvSpec,
                 frame_stack: int, priority_exponent: float, importance_exponent: float,
                 seed: int, kept: tuple[str, ...] = ()) -> None:
        """`capacity` transitions in segments of `trajectory_length`, filled from chunks of
        `columns` columns; `frame_stack` > 1 stores the last observation axis as frames;
        `kept`: the chunk fields the algorithm's replay keeps beside the standard ones
        (`srl_jax.dataflow.algorithms.Replay.fields`)."""
        T = trajectory_length
        self.T, self.spec = T, spec
        self.segments = max(capacity // T, columns)
        self.alpha, self.beta = priority_exponent, importance_exponent
        self.rng = np.random.default_rng(seed)
        S = self.segments
        self.frames: FrameStore | None = None
        if frame_stack > 1:
            # A segment without resets needs T + K frames; one insert at most (T + 1) K a column.
            self.frames = FrameStore(S * (T + frame_stack) + columns * (T + 1) * frame_stack,
                                     spec.obs_shape[:-1], np.dtype(spec.obs_dtype), frame_stack)
            self.obs = np.zeros((S, T + 1, frame_stack), np.int64)  # frame serials
        else:
            self.obs = np.zeros((S, T + 1, *spec.obs_shape), spec.obs_dtype)
        self.actions = np.zeros((S, T, *spec.action_shape), spec.action_dtype)
        self.states = np.zeros((S, spec.state_size), np.float32)
        """The recurrent state each segment's actor acted from at its first step (width 0
        without a core)."""
        self.rewards = np.zeros((S, T), np.float32)
        self.terminated = np.zeros((S, T), bool)
        self.truncated = np.zeros((S, T), bool)
        self.trunc_values = np.zeros((S, T), np.float32)
        self.final_obs = (np.zeros((S, T, *spec.obs_shape), spec.obs_dtype) if spec.final_obs
                          else None)
        """Where the chunks carry them, the final observations of time-limit cuts: a window
        that ends in one bootstraps from it as from any next observation."""
        self.kept = {f.name: np.zeros((S, f.rows(T), *f.shape(spec)), f.dtype(spec))
                     for f in CHUNK_FIELDS if f.name in kept}
        """The algorithm's own fields, per segment and step (a per-env field, as the global
        state, repeated for each agent column of its env)."""
        self.fields = replay_fields(self.sequences, kept)
        """The fields of a sampled batch."""
        self.generations = np.zeros(S, np.int64)
        self.live = np.zeros(S, bool)
        self.priorities = np.zeros(S * self.leaves_per_segment, np.float64)
        """Raw priorities (|TD error|), for the statistics; the tree holds p ** alpha."""
        self.tree = SumTree(S * self.leaves_per_segment)
        self.max_priority = 1.0
        self.next_segment = 0
        self.inserts = 0

    @property
    def leaves_per_segment(self) -> int:
        """Sampled items per segment: its T transitions."""
        return self.T

    @property
    def sequences(self) -> bool:
        """Whether it samples whole segments (`SequenceBuffer`) rather than transitions."""
        return False

    @property
    def sampled_window(self) -> int | None:
        """The only window a sample request may ask for; None: any (n-step windows)."""
        return None

    @property
    def steps_per_item(self) -> int:
        """Steps a sampled item stands for in the rate limiter, which counts inserts in
        steps too: a transition's, a whole sequence's T, a position's one."""
        return 1

    @property
    def stored_fields(self) -> tuple[str, ...]:
        """The chunk fields kept per step as they are ([T or T + 1] per segment)."""
        return ("actions", "rewards", "terminated", "truncated", "trunc_values",
                *(("final_obs",) if self.final_obs is not None else ()))

    @property
    def size(self) -> int:
        """Transitions held that can be sampled."""
        return int(self.live.sum()) * self.T

    @property
    def items(self) -> int:
        """Items that can be sampled (the N of the importance weights)."""
        return int(self.live.sum()) * self.leaves_per_segment

    @property
    def nbytes(self) -> int:
        arrays = [getattr(self, name) for name in self.stored_fields]
        arrays += [self.obs, self.states, self.generations, self.live, self.priorities,
                   self.tree.nodes, *self.kept.values()]
        return sum(a.nbytes for a in arrays) + (self.frames.nbytes if self.frames else 0)

    def _leaves(self, segments: np.ndarray) -> np.ndarray:
        per = self.leaves_per_segment
        return (segments[:, None] * per + np.arange(per)).reshape(-1)

    def _drop(self, segments: np.ndarray) -> None:
        self.live[segments] = False
        leaves = self._leaves(segments)
        self.priorities[leaves] = 0.0
        self.tree.update(leaves, np.zeros(len(leaves)))

    def insert(self, chunk: dict[str, np.ndarray]) -> int:
        """Store a chunk's columns (arrays [T or T+1, n, ...], checked against the run's
        chunk layout by the caller); returns the transitions added."""
        n = chunk["actions"].shape[1]
        where = (self.next_segment + np.arange(n)) % self.segments
        self.next_segment = int(where[-1] + 1) % self.segments
        self.inserts += 1
        obs = chunk["obs"]
        self.obs[where] = (self.frames.add(obs) if self.frames is not None
                           else np.swapaxes(obs, 0, 1))
        for name in self.stored_fields:
            getattr(self, name)[where] = np.swapaxes(chunk[name], 0, 1)
        self.states[where] = chunk["state"][0]
        per_env = {f.name for f in CHUNK_FIELDS if f.per_env}
        for name, store in self.kept.items():
            array = chunk[name]
            if name in per_env:  # columns are env-major: agent k of env e is e * agents + k
                array = np.repeat(array, self.spec.agents, axis=1)
            store[where] = np.swapaxes(array, 0, 1)
        self.generations[where] = self.inserts
        self.live[where] = True
        leaves = self._leaves(where)
        active, new = self._initial_priorities(chunk)
        self.priorities[leaves] = np.where(active, new, 0.0)
        self.tree.update(leaves, np.where(active, new ** self.alpha, 0.0))
        if self.frames is not None:
            stale = self.live & (self.obs[:, 0, 0] < self.frames.oldest)
            if stale.any():
                self._drop(np.flatnonzero(stale))
        return n * self.T

    def _initial_priorities(self, chunk: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(active, priority) of each new leaf. Rows of agents out of play (multi-agent
        padding) are kept, for the windows of their neighbours, but inactive: at priority
        0, never sampled, so no loss reads them."""
        active = np.swapaxes(chunk["active"], 0, 1).reshape(-1).astype(bool)
        given = chunk.get("priorities")
        if given is not None and given.shape[-1]:  # the actor's (Ape-X)
            new = np.swapaxes(given[..., 0], 0, 1).reshape(-1).astype(np.float64)
            if len(new):
                self.max_priority = max(self.max_priority, float(new[active].max(initial=0)))
            return active, new
        return active, np.full(len(active), self.max_priority)

    def sample(self, rows: int, window: int) -> dict[str, np.ndarray]:
        """`rows` transitions drawn by priority, each with its window of up to `window`
        steps (`srl_jax.dataflow.replay_spec`); the buffer must hold at least one."""
        if not self.live.any():
            raise ValueError("sample from an empty replay buffer")
        T = self.T
        slots = self.tree.sample(rows, self.rng)
        segment, start = slots // T, slots % T
        probabilities = self.tree.values(slots) / self.tree.total
        weights = (self.items * probabilities) ** -self.beta
        offsets = np.arange(window)
        steps_at = np.minimum(start[:, None] + offsets, T - 1)  # [rows, window]
        inside = start[:, None] + offsets < T
        ends = (self.terminated[segment[:, None], steps_at]
                | self.truncated[segment[:, None], steps_at]) & inside
        # The window is its first steps up to and including the first end, within the segment.
        ended_before = np.cumsum(ends, axis=1) - ends > 0
        taken = inside & ~ended_before
        steps = taken.sum(1)
        last = start + steps - 1
        truncated = self.truncated[segment, last]
        next_obs = self._observations(segment, last + 1)
        if self.final_obs is not None:  # the cut's own final observation, bootstrapped as any
            cut = truncated.reshape(-1, *[1] * (next_obs.ndim - 1))
            next_obs = np.where(cut, self.final_obs[segment, last], next_obs)
            truncated = np.zeros_like(truncated)
        out = {
            "obs": self._observations(segment, start),
            "actions": self.actions[segment, start],
            "rewards": np.where(taken, self.rewards[segment[:, None], steps_at], 0.0),
            "steps": steps,
            "terminated": self.terminated[segment, last],
            "truncated": truncated,
            "trunc_values": self.trunc_values[segment, last],
            "next_obs": next_obs,
            "weights": weights,
            "probabilities": probabilities,
            "slots": slots,
            "generations": self.generations[segment],
            **{name: store[segment, start] for name, store in self.kept.items()},
        }
        layout = replay_layout(rows, window, self.spec, self.fields)
        return {name: out[name].astype(dtype, copy=False) for name, (_, dtype) in layout.items()}

    def _observations(self, segment: np.ndarray, step: np.ndarray) -> np.ndarray:
        if self.frames is None:
            return self.obs[segment, step]
        return self.frames.gather(self.obs[segment, step])

    def update_priorities(self, slots: np.ndarray, generations: np.ndarray,
                          priorities: np.ndarray) -> int:
        """Set new priorities of sampled slots; an update for a slot overwritten (or
        dropped) since it was sampled is ignored. Returns how many were applied;
        ValueError for slots out of range or priorities not finite and >= 0."""
        leaves = self.segments * self.leaves_per_segment
        if len(slots) and (slots.min() < 0 or slots.max() >= leaves):
            raise ValueError(f"priority update for slots outside [0, {leaves})")
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            raise ValueError("priority update with priorities not finite and >= 0")
        segment = slots // self.leaves_per_segment
        current = (self.generations[segment] == generations) & self.live[segment]
        slots, priorities = slots[current], priorities[current]
        if len(slots):
            self.priorities[slots] = priorities
            self.tree.update(slots, priorities ** self.alpha)
            self.max_priority = max(self.max_priority, float(priorities.max()))
        return len(slots)

    def priority_stats(self) -> dict[str, float]:
        """Mean and largest raw priority of the transitions held (0 when empty)."""
        held = self.priorities[np.repeat(self.live, self.leaves_per_segment)]
        if not len(held):
            return {"mean": 0.0, "max": 0.0}
        return {"mean": float(held.mean()), "max": float(held.max())}
