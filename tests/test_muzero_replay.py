"""MuZero's replay as its papers define it, without JAX: positions sampled by their own
priorities, windows that no chunk boundary cuts, and reanalysis that reaches every part
of the buffer."""

from __future__ import annotations

import dataclasses

import numpy as np

from actors.env_ring import ChunkBuilder, StepResult
from replay.position_buffer import PositionBuffer
from replay.reanalysing_replay import reanalysed_rows
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec

SPEC = dataclasses.replace(EnvSpec((3,), np.dtype(np.float32), 2, continuous=False),
                           search_policy=True)
K, N_STEP = 2, 3
WINDOW = K + N_STEP
TAIL = WINDOW - 1


def positions_buffer(T: int, columns: int, capacity: int, alpha: float = 1.0,
                     beta: float = 1.0) -> PositionBuffer:
    return PositionBuffer(capacity, T, columns, SPEC, 1, alpha, beta, seed=0,
                          positions=T - TAIL, window=WINDOW)


def numbered_chunk(T: int, columns: int, first: int) -> dict[str, np.ndarray]:
    """A chunk whose step t of column c has reward first + t (and obs [first + t, c, 0])."""
    chunk = empty_chunk(T, columns, SPEC)
    steps = first + np.arange(T + 1, dtype=np.float32)
    chunk["obs"][..., 0] = steps[:, None]
    chunk["obs"][..., 1] = np.arange(columns)[None, :]
    chunk["rewards"][:] = steps[:T, None]
    return chunk


def test_positions_are_sampled_by_their_own_priority_and_weighted_by_it() -> None:
    """MuZero samples a position with probability p^alpha / sum and weights it by
    (N P)^-beta over the N positions held, not a whole sequence by its sequence's."""
    T, columns = 8, 2
    buffer = positions_buffer(T, columns, capacity=T * columns)
    P = T - TAIL
    # The rate limiter counts a position sampled against a position inserted, the tail
    # being the next chunk's positions.
    assert buffer.insert(numbered_chunk(T, columns, 0)) == P * columns
    assert buffer.steps_per_item == 1
    assert buffer.items == P * columns
    priorities = np.arange(1, P * columns + 1, dtype=np.float64)
    slots = np.arange(P * columns)
    assert buffer.update_priorities(slots, np.ones(len(slots), np.int64), priorities) == len(slots)
    draws = np.concatenate([buffer.sample(64, WINDOW)["slots"] for _ in range(400)])
    share = np.bincount(draws, minlength=len(slots)) / len(draws)
    np.testing.assert_allclose(share, priorities / priorities.sum(), atol=0.01)
    batch = buffer.sample(16, WINDOW)
    np.testing.assert_allclose(batch["probabilities"],
                               priorities[batch["slots"]] / priorities.sum())
    np.testing.assert_allclose(batch["weights"] * batch["probabilities"] * len(slots), 1.0,
                               rtol=1e-5)
    # Within one sequence, positions differ: the window starts at the position's own step.
    np.testing.assert_array_equal(batch["rewards"][:, 0], batch["slots"] % P)
    assert batch["obs"].shape == (16, WINDOW + 1, 3)


def test_the_last_positions_of_a_chunk_have_whole_windows_from_the_next_chunks_steps() -> None:
    """The actors repeat a chunk's last `window - 1` steps at the start of the next one;
    every step is a position of exactly one stored sequence, and its window runs on into
    what was the next chunk: no value target or unroll is cut at a chunk's end."""
    T, n = 8, 2
    builder = ChunkBuilder(T, np.zeros((n, 3), np.float32), SPEC, overlap=TAIL)
    buffer = positions_buffer(T, n, capacity=10 * T * n)
    owned = []
    for step in range(40):
        done = builder.on_policy(np.zeros(n, np.int64), np.zeros(n, np.float32),
                                 np.zeros(n, np.float32), 0, np.empty(0, np.float32),
                                 np.zeros((n, 0), np.float32),
                                 search_policy=np.full((n, 2), 0.5, np.float32))
        if done is not None:
            buffer.insert(done)
            owned += [int(r) for r in done["rewards"][:T - TAIL, 0]]
        builder.on_step(StepResult(
            rewards=np.full(n, float(step), np.float32), terminated=np.zeros(n, bool),
            truncated=np.zeros(n, bool), next_obs=np.full((n, 3), step + 1.0, np.float32),
            truncated_envs=np.empty(0, np.int64), final_obs=np.empty((0, 3), np.float32)))
    assert owned == list(range(len(owned))), "each step a position once, none lost"
    batch = buffer.sample(512, WINDOW)
    first = batch["rewards"][:, 0]
    np.testing.assert_array_equal(batch["rewards"], first[:, None] + np.arange(WINDOW))
    np.testing.assert_array_equal(batch["obs"][..., 0], first[:, None] + np.arange(WINDOW + 1))
    last = (batch["slots"] % (T - TAIL)) == T - TAIL - 1
    assert last.any(), "the last position of some chunk was drawn"


def test_reanalysis_renews_every_part_of_the_buffer_as_often_as_it_is_sampled() -> None:
    """The sum tree's stratified draws come back sorted by slot; reanalysing the first
    rows of each batch renewed the lower half of the buffer only. Drawn at random, every
    quarter is renewed in proportion to how often it is sampled."""
    T, columns = 12, 50
    buffer = positions_buffer(T, columns, capacity=T * columns)
    buffer.insert(numbered_chunk(T, columns, 0))
    quarters = 4 * np.arange(buffer.items) // buffer.items
    rng = np.random.default_rng(1)
    sampled = np.zeros(4)
    renewed = np.zeros(4)
    for _ in range(500):
        slots = buffer.sample(64, WINDOW)["slots"]
        chosen = reanalysed_rows(len(slots), 0.5, rng)
        sampled += np.bincount(quarters[slots], minlength=4)
        renewed += np.bincount(quarters[slots[chosen]], minlength=4)
    np.testing.assert_allclose(renewed / renewed.sum(), sampled / sampled.sum(), atol=0.02)
    assert abs(renewed.sum() / sampled.sum() - 0.5) < 0.02
