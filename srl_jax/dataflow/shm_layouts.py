"""The slot layouts of the same-host streams, from the run's config and a policy's spec:
both ends build them alike (srl_jax/wire/shm/layout.py says what a layout fixes).

- inference requests: `split`, `seq`; obs, and where the policy has them state
  (recurrent), action_mask (masked actions) and opponent (one that plays an opponent
  pool), each up to the most rows one of an actor's requests carries (`request_rows`:
  a split's columns, twice over), not the servers' `inference.max_batch`;
- inference replies: `split`, `seq`, `version`, `batch_rows`; action, logp, value, and
  where the policy has them state, q (actor priorities), search_policy (a policy that
  searches), opponent and the pool's versions (`pool`, up to `selfplay.pool`);
- chunks (samples, inserts): `actor`; every array of the run's chunk layout
  (srl_jax/dataflow/chunk_spec.py), and the recent episode returns (`episode_returns`).
"""

from __future__ import annotations

import numpy as np

from srl_jax.config.schema import ExperimentConfig, request_rows
from srl_jax.dataflow.chunk_spec import Layout
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.wire.shm.layout import Field, SlotLayout

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def request_layout(config: ExperimentConfig, spec: EnvSpec, policy: str) -> SlotLayout:
    rows, pooled = request_rows(config.actors, spec.agents), policy in config.selfplay.opponents
    return SlotLayout("infer_request", ("split", "seq"), (
        Field("obs", np.dtype(spec.obs_dtype), tuple(spec.obs_shape), rows),
        *([Field("state", F32, (spec.state_size,), rows)] if spec.state_size else []),
        *([Field("action_mask", np.dtype(bool), (spec.action_dim,), rows)]
          if spec.action_masked else []),
        *([Field("opponent", I64, (), rows)] if pooled else [])))


def reply_layout(config: ExperimentConfig, spec: EnvSpec, policy: str) -> SlotLayout:
    rows, pooled = request_rows(config.actors, spec.agents), policy in config.selfplay.opponents
    action = Field("action", F32, tuple(spec.action_shape), rows) if spec.continuous \
        else Field("action", np.dtype(np.int32), (), rows)
    return SlotLayout("infer_reply", ("split", "seq", "version", "batch_rows"), (
        action, Field("logp", F32, (), rows), Field("value", F32, (), rows),
        *([Field("state", F32, (spec.state_size,), rows)] if spec.state_size else []),
        *([Field("q", F32, (spec.action_dim,), rows)] if spec.action_values else []),
        *([Field("search_policy", F32, (spec.action_dim,), rows)] if spec.search_policy
          else []),
        *([Field("opponent", I64, (), rows),
           Field("pool", I64, (), max(config.selfplay.pool, 1), as_list=True)]
          if pooled else [])))


def chunk_slot_layout(chunk: Layout, max_returns: int) -> SlotLayout:
    """A chunk of `chunk`'s arrays (each sent whole), with up to `max_returns` returns."""
    fields = [Field(name, np.dtype(dtype), tuple(shape[1:]), shape[0])
              for name, (shape, dtype) in sorted(chunk.items())]
    return SlotLayout("samples", ("actor",), (
        *fields, Field("episode_returns", np.dtype(np.float64), (), max_returns, as_list=True)))
