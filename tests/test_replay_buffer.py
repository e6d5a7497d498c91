"""The replay server's parts on arrays: sum tree, frame store, buffer windows, rate limiter,
and the epsilon ladder actors explore with."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from actors.exploration import column_epsilons, epsilon_ladder, explore
from replay.buffer import ReplayBuffer
from replay.frame_store import FrameStore
from replay.rate_limiter import RateLimiter, error_buffer
from replay.sum_tree import SumTree
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import replay_layout

VECTOR = EnvSpec((3,), np.dtype(np.float32), 2, False)
FRAMES = EnvSpec((24, 24, 4), np.dtype(np.uint8), 6, False)


def test_sum_tree_samples_in_proportion_and_never_an_empty_leaf() -> None:
    tree = SumTree(5)
    tree.update(np.array([0, 1, 2, 3, 4, 4]), np.array([1.0, 0.0, 3.0, 6.0, 5.0, 0.0]))
    assert tree.total == pytest.approx(10.0), "the last value of a repeated leaf wins"
    counts = np.bincount(tree.sample(100_000, np.random.default_rng(0)), minlength=5)
    assert counts[1] == counts[4] == 0
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0, 0.3, 0.6, 0], atol=0.01)
    assert list(tree.find(np.array([0.0, 0.999, 1.0, 3.999, 4.0, 9.999]))) == [0, 0, 2, 2, 3, 3]


def _chunk(T: int, n: int, spec: EnvSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    chunk = empty_chunk(T, n, spec)
    chunk["obs"][:] = rng.normal(size=chunk["obs"].shape)
    chunk["actions"][:] = rng.integers(0, spec.action_dim, chunk["actions"].shape)
    chunk["rewards"][:] = np.arange(T)[:, None] + 100 * np.arange(n)
    return chunk


def test_a_window_stops_at_the_end_of_its_episode_or_of_its_segment() -> None:
    T, n = 6, 2
    chunk = _chunk(T, n, VECTOR, np.random.default_rng(1))
    chunk["terminated"][2, 0] = True   # column 0: episode ends at step 2
    chunk["truncated"][1, 1] = True    # column 1: time limit at step 1
    chunk["trunc_values"][1, 1] = 7.5
    buffer = ReplayBuffer(100, T, n, VECTOR, 1, 0.0, 0.0, seed=0)
    assert buffer.insert(chunk) == T * n and buffer.size == T * n
    batch = buffer.sample(400, window=3)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == replay_layout(400, 3, VECTOR)
    seen = set()
    for i in range(400):
        column, start = divmod(int(batch["slots"][i]), T)
        seen.add((column, start))
        episode_end = 2 if column == 0 else 1
        end = episode_end if start <= episode_end else T - 1
        steps = min(3, end - start + 1)
        assert batch["steps"][i] == steps, (column, start)
        np.testing.assert_array_equal(
            batch["rewards"][i], [start + k + 100 * column if k < steps else 0 for k in range(3)])
        last = start + steps - 1
        assert batch["terminated"][i] == (column == 0 and last == 2)
        assert batch["truncated"][i] == (column == 1 and last == 1)
        assert batch["trunc_values"][i] == (7.5 if column == 1 and last == 1 else 0)
        np.testing.assert_array_equal(batch["obs"][i], chunk["obs"][start, column])
        np.testing.assert_array_equal(batch["next_obs"][i], chunk["obs"][last + 1, column])
        assert batch["actions"][i] == chunk["actions"][start, column]
    assert len(seen) == T * n, "uniform sampling reaches every transition"
    np.testing.assert_allclose(batch["probabilities"], 1 / (T * n))
    np.testing.assert_allclose(batch["weights"], 1.0)


def test_a_window_cut_by_a_time_limit_bootstraps_from_its_final_observation() -> None:
    T, n = 6, 2
    spec = dataclasses.replace(VECTOR, final_obs=True)
    chunk = _chunk(T, n, spec, np.random.default_rng(3))
    chunk["truncated"][1, 1] = True  # column 1: a time limit at step 1, then a new episode
    chunk["final_obs"][1, 1] = [7.0, 8.0, 9.0]
    buffer = ReplayBuffer(100, T, n, spec, 1, 0.0, 0.0, seed=0)
    buffer.insert(chunk)
    batch = buffer.sample(400, window=3)
    assert not batch["truncated"].any(), "the target network values the final observation"
    for i in range(400):
        column, start = divmod(int(batch["slots"][i]), T)
        last = start + batch["steps"][i] - 1
        want = [7.0, 8.0, 9.0] if (column, last) == (1, 1) else chunk["obs"][last + 1, column]
        np.testing.assert_array_equal(batch["next_obs"][i], want)
    assert {(int(s) // T, int(s) % T) for s in batch["slots"]} >= {(1, 0), (1, 1)}


def test_the_ring_overwrites_the_oldest_and_its_memory_stays_put() -> None:
    T, n = 4, 3
    buffer = ReplayBuffer(24, T, n, VECTOR, 1, 0.6, 0.4, seed=0)
    rng = np.random.default_rng(2)
    nbytes = buffer.nbytes
    chunks = [_chunk(T, n, VECTOR, rng) for _ in range(5)]
    for chunk in chunks:
        buffer.insert(chunk)
    assert buffer.size == 24 and buffer.nbytes == nbytes
    held = {tuple(row) for row in buffer.sample(500, 1)["obs"]}
    newest = {tuple(chunk["obs"][t, c]) for chunk in chunks[-2:] for t in range(T)
              for c in range(n)}
    assert held == newest, "the 6 segments held are the last two chunks' columns"


def test_priorities_steer_sampling_and_stale_or_bad_updates_do_not() -> None:
    T, n = 4, 2
    buffer = ReplayBuffer(8, T, n, VECTOR, 1, 1.0, 1.0, seed=0)
    buffer.insert(_chunk(T, n, VECTOR, np.random.default_rng(3)))
    batch = buffer.sample(8, 1)
    slots, generations = np.arange(8), np.full(8, batch["generations"][0])
    priorities = np.array([1e-6] * 7 + [10.0])
    assert buffer.update_priorities(slots, generations, priorities) == 8
    batch = buffer.sample(1000, 1)
    assert np.mean(batch["slots"] == 7) > 0.99
    np.testing.assert_allclose(batch["weights"] * batch["probabilities"] * buffer.size,
                               1.0, rtol=1e-6)
    assert buffer.priority_stats()["max"] == 10.0
    buffer.insert(_chunk(T, n, VECTOR, np.random.default_rng(4)))  # overwrites both segments
    assert buffer.update_priorities(slots, generations, np.ones(8)) == 0, "stale: ignored"
    with pytest.raises(ValueError, match="outside"):
        buffer.update_priorities(np.array([8]), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        buffer.update_priorities(np.array([0]), np.array([0]), np.array([np.nan]))


def _atari_chunk(T: int, n: int, rng: np.random.Generator, resets: dict) -> dict:
    """Stacked frames as a frame-stack wrapper makes them; a reset repeats its first frame."""
    chunk = empty_chunk(T, n, FRAMES)
    for c in range(n):
        stack = np.repeat(rng.integers(0, 255, (24, 24, 1), np.uint8), 4, -1)
        for t in range(T + 1):
            if t and t in resets.get(c, ()):
                stack = np.repeat(rng.integers(0, 255, (24, 24, 1), np.uint8), 4, -1)
            elif t:
                stack = np.concatenate([stack[..., 1:], rng.integers(0, 255, (24, 24, 1),
                                                                      np.uint8)], -1)
            chunk["obs"][t, c] = stack
    return chunk


def test_stacked_frames_are_stored_once_and_come_back_exact() -> None:
    T, n = 8, 2
    rng = np.random.default_rng(5)
    store = FrameStore(1000, (24, 24), np.dtype(np.uint8), 4)
    chunk = _atari_chunk(T, n, rng, {1: (3,)})
    serials = store.add(chunk["obs"])
    assert store.next_serial == (4 + T) + (4 + 2 + 4 + T - 3), "a reset stores a whole stack"
    np.testing.assert_array_equal(store.gather(serials), np.swapaxes(chunk["obs"], 0, 1))

    buffer = ReplayBuffer(10 * T * n, T, n, FRAMES, 4, 0.0, 0.0, seed=0)
    plain = ReplayBuffer(10 * T * n, T, n, FRAMES, 1, 0.0, 0.0, seed=0)
    chunks = [_atari_chunk(T, n, rng, {0: (5,)}) for _ in range(25)]  # wraps both rings
    for chunk in chunks:
        buffer.insert(chunk)
        plain.insert(chunk)
    a, b = buffer.sample(300, 3), plain.sample(300, 3)
    for i in range(300):
        chunk = chunks[int(a["generations"][i]) - 1]
        segment, start = divmod(int(a["slots"][i]), T)
        column, last = segment % n, start + int(a["steps"][i]) - 1
        np.testing.assert_array_equal(a["obs"][i], chunk["obs"][start, column])
        np.testing.assert_array_equal(a["next_obs"][i], chunk["obs"][last + 1, column])
    assert b["obs"].shape == a["obs"].shape
    assert buffer.nbytes < 0.5 * plain.nbytes, (buffer.nbytes, plain.nbytes)


def test_the_rate_limiter_holds_the_ratio_and_never_locks_both_sides() -> None:
    limiter = RateLimiter(100, 4.0, error_buffer(100, 0.1, 4.0))
    assert not limiter.can_sample(99) and limiter.can_insert()
    size = inserted = sampled = 0
    rng = np.random.default_rng(6)
    for _ in range(5000):
        moved = False
        if rng.random() < 0.5 and limiter.can_insert():
            limiter.inserted(16)
            size, inserted, moved = min(size + 16, 1000), inserted + 16, True
        if limiter.can_sample(size):
            limiter.sampled(32)
            sampled, moved = sampled + 32, True
        assert moved or limiter.can_insert(), "one side can always move"
    assert abs(sampled - 4 * (inserted - 100)) <= 40 + 32 + 64
    unlimited = RateLimiter(10, 0.0, 0.0)
    assert unlimited.can_insert() and unlimited.can_sample(10) and not unlimited.can_sample(9)


def test_the_epsilon_ladder_is_apex_formula_over_all_columns() -> None:
    ladder = epsilon_ladder(0.4, 7.0, 8)
    np.testing.assert_allclose(ladder, [0.4 ** (1 + 7 * i / 7) for i in range(8)])
    parts = [column_epsilons(0.4, 7.0, 2, a, s, 2, 2) for a in range(2) for s in range(2)]
    np.testing.assert_array_equal(np.concatenate(parts), ladder)
    rng = np.random.default_rng(7)
    actions = np.zeros(20_000, np.int32)
    explored = explore(actions, np.full(20_000, 0.3), 4, rng)
    assert abs(np.mean(explored != 0) - 0.3 * 3 / 4) < 0.01
    assert explore(actions, np.zeros(20_000), 4, rng) is actions


def test_rows_of_agents_out_of_play_are_kept_but_never_sampled() -> None:
    T, n = 6, 2
    chunk = _chunk(T, n, VECTOR, np.random.default_rng(5))
    chunk["active"][:3, 1] = False  # column 1's agent enters play at step 3
    chunk["terminated"][:3, 1] = True
    buffer = ReplayBuffer(100, T, n, VECTOR, 1, 0.0, 0.0, seed=0)
    buffer.insert(chunk)
    slots = buffer.sample(500, window=2)["slots"]
    column, start = np.divmod(slots, T)
    assert not ((column == 1) & (start < 3)).any()
    assert ((column == 1) & (start >= 3)).any() and (column == 0).any()
