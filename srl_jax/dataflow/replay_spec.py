"""A batch sampled from replay, declared once: what a replay server sends and a learner trains on.

A replay server stores the steps of the chunks actors send it (`srl_jax.dataflow.chunk_spec`)
and answers a sample request of `rows` transitions and a `window` of n steps with
one `SampledBatch`: each row is a transition at its start step, the rewards of the
n steps that follow it in its chunk column, and how the window ended. A window
stops early at the end of an episode (termination or truncation) and at the end of
its chunk column (whose last observation is the bootstrap); the learner turns it
into an n-step target with its own discount (`learners/algorithms/dqn.py`).

`REPLAY_FIELDS` says, per field, its shape for one row as a function of the env
spec and the window, its dtype, and whether the learner's update reads it (the
rest route priority updates back, or weight the batch on the learner's host).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from srl_jax.dataflow.chunk_spec import CHUNK_FIELDS, ChunkField, Layout
from srl_jax.dataflow.env_spec import EnvSpec


@dataclass(frozen=True)
class ReplayField:
    name: str
    shape: Callable[[EnvSpec, int], tuple[int, ...]]
    """Shape of one row's entry, from the spec and the window n."""
    dtype: Callable[[EnvSpec], np.dtype]
    trained: bool
    """The learner's update reads it (it goes onto the device mesh)."""
    doc: str


def _scalar(spec: EnvSpec, window: int) -> tuple[int, ...]:
    return ()


def _fixed(dtype: type) -> Callable[[EnvSpec], np.dtype]:
    return lambda spec: np.dtype(dtype)


REPLAY_FIELDS: tuple[ReplayField, ...] = (
    ReplayField("obs", lambda s, n: s.obs_shape, lambda s: np.dtype(s.obs_dtype), True,
                "observation the transition acted on"),
    ReplayField("actions", lambda s, n: s.action_shape, lambda s: s.action_dtype, True,
                "action taken (greedy or, with probability epsilon, random)"),
    ReplayField("rewards", lambda s, n: (n,), _fixed(np.float32), True,
                "rewards of the window's steps, zero past its last step"),
    ReplayField("steps", _scalar, _fixed(np.int32), True,
                "k in 1..n: steps in the window before it stopped"),
    ReplayField("terminated", _scalar, _fixed(np.float32), True,
                "1 where the window's last step ended its episode in a terminal state"),
    ReplayField("truncated", _scalar, _fixed(np.float32), True,
                "1 where the window's last step was cut by a time limit and its final "
                "observation is not stored (`EnvSpec.final_obs`)"),
    ReplayField("trunc_values", _scalar, _fixed(np.float32), True,
                "acting policy's value of the final observation where truncated (the "
                "bootstrap where the final observation itself is not stored)"),
    ReplayField("next_obs", lambda s, n: s.obs_shape, lambda s: np.dtype(s.obs_dtype), True,
                "observation after the window's last step (the bootstrap observation; "
                "after a time-limit cut, its final observation where stored)"),
    ReplayField("weights", _scalar, _fixed(np.float32), True,
                "importance weight (N * P(i)) ** -beta within its server (N: its size); "
                "the learner's intake replaces it with the weight over all shards, and the "
                "update divides by the batch's largest"),
    ReplayField("probabilities", _scalar, _fixed(np.float64), False,
                "probability this server sampled the row with, among its own (priority "
                "share)"),
    ReplayField("slots", _scalar, _fixed(np.int64), False,
                "the row's slot in its server's ring (for priority updates)"),
    ReplayField("generations", _scalar, _fixed(np.int64), False,
                "the slot's insert count when sampled: an update for an overwritten "
                "slot is ignored"),
)


_ROUTING = REPLAY_FIELDS[-4:]
"""weights, probabilities, slots, generations: every sampled batch carries them."""

SEQUENCE_FIELDS: tuple[ReplayField, ...] = (
    ReplayField("obs", lambda s, T: (T + 1, *s.obs_shape), lambda s: np.dtype(s.obs_dtype),
                True, "the sequence's observations, plus the one after its last step"),
    ReplayField("actions", lambda s, T: (T, *s.action_shape), lambda s: s.action_dtype, True,
                "actions taken"),
    ReplayField("rewards", lambda s, T: (T,), _fixed(np.float32), True, "rewards received"),
    ReplayField("terminated", lambda s, T: (T,), _fixed(np.float32), True,
                "1 where the step ended its episode in a terminal state"),
    ReplayField("truncated", lambda s, T: (T,), _fixed(np.float32), True,
                "1 where the step was cut by a time limit"),
    ReplayField("trunc_values", lambda s, T: (T,), _fixed(np.float32), True,
                "acting policy's value of the final observation where truncated"),
    ReplayField("search_policy",
                lambda s, T: (T, s.action_dim if s.search_policy else 0), _fixed(np.float32),
                True, "the search's policy at each step (width 0: a policy that does not "
                "search)"),
    ReplayField("final_obs",
                lambda s, T: (T, *(s.obs_shape if s.final_obs else (0,))),
                lambda s: np.dtype(s.obs_dtype), True,
                "the final observation of each step a time limit cut, where stored "
                "(`EnvSpec.final_obs`; width 0 otherwise): a target network's bootstrap"),
    ReplayField("state", lambda s, T: (s.state_size,), _fixed(np.float32), True,
                "recurrent state the actor acted from at the first step (R2D2's stored "
                "state)"),
    *_ROUTING,
)
"""A sampled batch of whole chunk columns (R2D2's sequences): the `window` of its
layout is the sequence length T; the routing fields are per sequence."""


def kept_field(name: str, sequences: bool) -> ReplayField:
    """Chunk field `name` as a sampled batch carries it where an algorithm's replay keeps it
    (`srl_jax.dataflow.algorithms.Replay.fields`): its entry at each transition's first
    step, or its rows along each sequence (T, or T + 1 for a field with the next step's)."""
    chunk: ChunkField = next(f for f in CHUNK_FIELDS if f.name == name)
    if sequences:
        return ReplayField(name, lambda s, T: (chunk.rows(T), *chunk.shape(s)), chunk.dtype,
                           True, chunk.doc)
    return ReplayField(name, lambda s, n: chunk.shape(s), chunk.dtype, True, chunk.doc)


def replay_fields(sequences: bool, kept: tuple[str, ...] = ()) -> tuple[ReplayField, ...]:
    """The fields of a sampled batch: of sequences, or of n-step transitions, with the
    chunk fields `kept` beside the standard ones."""
    fields = SEQUENCE_FIELDS if sequences else REPLAY_FIELDS
    if not kept:
        return fields
    routing = len(_ROUTING)
    return (*fields[:-routing], *(kept_field(name, sequences) for name in kept),
            *fields[-routing:])


def replay_layout(rows: int, window: int, spec: EnvSpec,
                  fields: tuple[ReplayField, ...] = REPLAY_FIELDS) -> Layout:
    """Shape and dtype of every array of a sampled batch of `rows` rows."""
    return {f.name: ((rows, *f.shape(spec, window)), f.dtype(spec)) for f in fields}


def empty_replay_batch(rows: int, window: int, spec: EnvSpec,
                       fields: tuple[ReplayField, ...] = REPLAY_FIELDS) -> dict[str, np.ndarray]:
    """A zeroed sampled batch (the learner compiles its update on one)."""
    return {name: np.zeros(shape, dtype)
            for name, (shape, dtype) in replay_layout(rows, window, spec, fields).items()}


def replay_batch_fields(fields: tuple[ReplayField, ...] = REPLAY_FIELDS) -> tuple[str, ...]:
    """Names of the fields the learner's update reads, in spec order."""
    return tuple(f.name for f in fields if f.trained)
