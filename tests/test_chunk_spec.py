"""The chunk spec: one declaration from which the layout, the empty chunk and the Batch derive."""

from __future__ import annotations

import numpy as np
import pytest

from actors.env_ring import ChunkBuilder
from learners.algorithms.train_state import Batch, batch_type, to_batch
from srl_jax.dataflow.chunk_spec import (
    CHUNK_FIELDS,
    ChunkField,
    batch_arrays,
    batch_fields,
    chunk_layout,
    empty_chunk,
)
from srl_jax.dataflow.env_spec import EnvSpec

CARTPOLE = EnvSpec((4,), np.dtype(np.float32), 2, continuous=False)
PENDULUM = EnvSpec((3,), np.dtype(np.float32), 1, continuous=True)
T, N = 5, 3


def test_layout_follows_extent_and_env_spec():
    layout = chunk_layout(T, N, PENDULUM)
    assert list(layout) == [f.name for f in CHUNK_FIELDS]
    assert layout["obs"] == ((T + 1, N, 3), np.dtype(np.float32))
    assert layout["actions"] == ((T, N, 1), np.dtype(np.float32))
    assert layout["values"] == ((T + 1, N), np.dtype(np.float32))
    assert layout["terminated"] == ((T, N), np.dtype(bool))
    assert chunk_layout(T, N, CARTPOLE)["actions"] == ((T, N), np.dtype(np.int32))


def test_empty_chunk_and_chunk_builder_match_the_layout():
    layout = chunk_layout(T, N, CARTPOLE)
    for arrays in (empty_chunk(T, N, CARTPOLE),
                   ChunkBuilder(T, np.zeros((N, 4), np.float32), CARTPOLE).arrays):
        assert {k: (a.shape, a.dtype) for k, a in arrays.items()} == layout


def test_batch_holds_the_trained_on_fields_in_their_batch_dtypes():
    assert Batch._fields == batch_fields()
    assert "versions" not in Batch._fields, "read by the sample queue, not trained on"
    batch = to_batch(empty_chunk(T, N, CARTPOLE))
    assert batch.terminated.dtype == np.float32 and batch.truncated.dtype == np.float32
    assert batch.actions.dtype == np.int32, "kept as sent"


def test_adding_a_field_is_one_line_in_the_spec():
    priority = ChunkField("priority", "T", lambda s: (), lambda s: np.dtype(np.float16),
                          np.dtype(np.float32), "a replay priority per step")
    fields = (*CHUNK_FIELDS, priority)
    assert chunk_layout(T, N, CARTPOLE, fields)["priority"] == ((T, N), np.dtype(np.float16))
    chunk = empty_chunk(T, N, CARTPOLE, fields)
    assert chunk["priority"].dtype == np.float16
    Extended = batch_type(fields)
    batch = Extended(**batch_arrays(chunk, fields))
    assert Extended._fields == (*Batch._fields, "priority")
    assert batch.priority.dtype == np.float32 and batch.priority.shape == (T, N)


@pytest.mark.parametrize("extent, rows", [("T", T), ("T+1", T + 1)])
def test_rows_per_extent(extent, rows):
    field = ChunkField("x", extent, lambda s: (), lambda s: np.dtype(np.float32), None, "")
    assert field.rows(T) == rows
