"""The trajectory chunk, declared once: every array an actor sends and a learner trains on.

An actor fills one chunk of T steps for the n columns of a split (envs times the
agents its policy acts for); consecutive chunks overlap by one observation. Each
`ChunkField` says how many rows it has ("T": one per step, "T+1": one per step
plus the next, "1": one for the whole chunk, at its first step), the shape and
dtype of one column's entry as functions of the `EnvSpec`, and the dtype the
learner's batch holds it in (None: the learner does not train on it, as for
`versions`, which only the sample queue reads). A per-env field (`per_env`) has
one column per env rather than one per agent.

From `CHUNK_FIELDS` come the actor's empty chunk (`empty_chunk`), the learner's
check of a received chunk (`chunk_layout`) and the learner's `Batch` pytree
(`batch_fields`, `batch_arrays`; see learners/algorithms/train_state.py). Adding a field is
one line here, plus the code that writes it and the code that reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.env_spec import EnvSpec

Extent = Literal["T", "T+1", "1"]
AS_SENT: Final = "as sent"
"""`batch_dtype` of a field the batch keeps in its chunk dtype (e.g. uint8 frames)."""


@dataclass(frozen=True)
class ChunkField:
    name: str
    extent: Extent
    shape: Callable[[EnvSpec], tuple[int, ...]]
    """Shape of one column's entry at one step."""
    dtype: Callable[[EnvSpec], np.dtype]
    batch_dtype: np.dtype | Literal["as sent"] | None
    doc: str
    per_env: bool = False
    """One column per env rather than per agent (n / `EnvSpec.agents` columns): what
    every agent of an env shares, as the global state."""
    fill: int = 0
    """What an empty chunk holds before an actor writes it."""

    def rows(self, T: int) -> int:
        return {"T": T, "T+1": T + 1, "1": 1}[self.extent]

    def columns(self, n: int, spec: EnvSpec) -> int:
        return n // spec.agents if self.per_env else n


def _scalar(spec: EnvSpec) -> tuple[int, ...]:
    return ()


def _fixed(dtype: type) -> Callable[[EnvSpec], np.dtype]:
    return lambda spec: np.dtype(dtype)


F32 = np.dtype(np.float32)

CHUNK_FIELDS: tuple[ChunkField, ...] = (
    ChunkField("obs", "T+1", lambda s: s.obs_shape, lambda s: np.dtype(s.obs_dtype), AS_SENT,
               "observation each step acted on, plus the next"),
    ChunkField("actions", "T", lambda s: s.action_shape, lambda s: s.action_dtype, AS_SENT,
               "action sampled (int32, or float32 vectors)"),
    ChunkField("logp", "T", _scalar, _fixed(np.float32), F32,
               "its log-probability under the acting policy"),
    ChunkField("values", "T+1", _scalar, _fixed(np.float32), F32,
               "acting policy's value of `obs` (last: bootstrap)"),
    ChunkField("rewards", "T", _scalar, _fixed(np.float32), F32, "reward received"),
    ChunkField("terminated", "T", _scalar, _fixed(bool), F32,
               "episode ended in a terminal state (no bootstrap)"),
    ChunkField("truncated", "T", _scalar, _fixed(bool), F32,
               "episode cut by a time limit (bootstrap)"),
    ChunkField("trunc_values", "T", _scalar, _fixed(np.float32), F32,
               "value of the final observation where truncated"),
    ChunkField("state", "1", lambda s: (s.state_size,), _fixed(np.float32), F32,
               "recurrent state of the acting policy at the first step (width 0: no core)"),
    ChunkField("active", "T", _scalar, _fixed(bool), F32,
               "the column's agent acted (false: padding for an agent out of play, which "
               "no loss, statistic or metric reads)", fill=1),
    ChunkField("action_mask", "T", lambda s: (s.action_dim if s.action_masked else 0,),
               _fixed(bool), AS_SENT, "legal actions at the step (width 0: all legal)"),
    ChunkField("global_state", "T+1", lambda s: (s.global_state_size,), _fixed(np.float32),
               F32, "env's global state at `obs` (width 0: no centralized critic)",
               per_env=True),
    ChunkField("trunc_global_state", "T", lambda s: (s.global_state_size,),
               _fixed(np.float32), F32, "global state of the final observation where "
               "truncated", per_env=True),
    ChunkField("final_obs", "T", lambda s: s.obs_shape if s.final_obs else (0,),
               lambda s: np.dtype(s.obs_dtype), None, "final observation where a time limit "
               "cut the step (width 0: not kept, `EnvSpec.final_obs`)"),
    ChunkField("versions", "T", _scalar, _fixed(np.int32), None,
               "parameter version of the acting policy (read by the staleness cap)"),
    ChunkField("search_policy", "T", lambda s: (s.action_dim if s.search_policy else 0,),
               _fixed(np.float32), None, "the search's policy over the actions at the step, "
               "the policy head's target (width 0: a policy that does not search)"),
    ChunkField("priorities", "T", lambda s: (1 if s.action_values else 0,), _fixed(np.float32),
               None, "the step's initial replay priority, its n-step TD error under the "
               "acting network (width 0: replay gives new steps the largest priority)"),
)

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]


def chunk_layout(T: int, n: int, spec: EnvSpec,
                 fields: tuple[ChunkField, ...] = CHUNK_FIELDS) -> Layout:
    """Shape and dtype of every array of a chunk of T steps and n columns."""
    return {f.name: ((f.rows(T), f.columns(n, spec), *f.shape(spec)), f.dtype(spec))
            for f in fields}


def empty_chunk(T: int, n: int, spec: EnvSpec,
                fields: tuple[ChunkField, ...] = CHUNK_FIELDS) -> dict[str, np.ndarray]:
    """An empty chunk of T steps and n columns, for an actor to fill: zeros, but for the
    fields that say otherwise (every column active)."""
    layout = chunk_layout(T, n, spec, fields)
    return {f.name: np.full(layout[f.name][0], f.fill, layout[f.name][1]) for f in fields}


def batch_fields(fields: tuple[ChunkField, ...] = CHUNK_FIELDS) -> tuple[str, ...]:
    """Names of the fields the learner trains on, in spec order: its Batch's fields."""
    return tuple(f.name for f in fields if f.batch_dtype is not None)


def batch_arrays(arrays: dict[str, np.ndarray],
                 fields: tuple[ChunkField, ...] = CHUNK_FIELDS) -> dict[str, np.ndarray]:
    """The trained-on arrays of a chunk or batch, cast to their batch dtypes."""
    out = {}
    for f in fields:
        if f.batch_dtype is None:
            continue
        array = arrays[f.name]
        out[f.name] = array if f.batch_dtype == AS_SENT else array.astype(f.batch_dtype,
                                                                            copy=False)
    return out


def run_chunk_layout(config: ExperimentConfig, spec: EnvSpec) -> Layout:
    """The layout of every chunk an actor of this run sends for a policy with `spec`."""
    columns = config.actors.envs // config.actors.splits * spec.agents
    return chunk_layout(config.actors.trajectory_length, columns, spec)


def chunk_error(arrays: dict[str, np.ndarray], layout: Layout) -> str | None:
    """What is wrong with a chunk's arrays for `layout`; None if nothing is."""
    if arrays.keys() != layout.keys():
        return f"chunk with arrays {sorted(arrays)}"
    for name, (shape, dtype) in layout.items():
        if arrays[name].shape != shape or arrays[name].dtype != dtype:
            return (f"chunk array {name!r}: {arrays[name].dtype}{list(arrays[name].shape)} "
                    f"where {dtype}{list(shape)} was expected")
    return None
