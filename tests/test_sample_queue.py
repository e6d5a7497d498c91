"""The learner's sample queue: staleness cap, drop-oldest bound, batch assembly, and
the unit of its drop counters (frames)."""

from __future__ import annotations

import numpy as np
import zmq

from learners.intake.sample_intake import SampleIntake
from learners.training.sample_queue import SampleQueue
from srl_jax.dataflow.stream_table import SAMPLES
from srl_jax.wire.stream_ends import Binder
from srl_jax.wire.streams import RejectCounter

T = 3
FRAMES = T * 2
"""Frames of a default chunk: T steps of n = 2 columns."""


def chunk(tag: int, versions: int | list[int], n: int = 2) -> dict[str, np.ndarray]:
    """A [T(+1), n] chunk whose arrays carry `tag` so batches can be traced back to it."""
    v = np.broadcast_to(np.asarray(versions, np.int32).reshape(-1, 1), (T, n)).copy()
    return {
        "obs": np.full((T + 1, n, 4), tag, np.float32),
        "actions": np.full((T, n), tag, np.int32),
        "values": np.full((T + 1, n), tag, np.float32),
        "rewards": np.full((T, n), tag, np.float32),
        "terminated": np.zeros((T, n), bool),
        "versions": v,
    }


def tags(batch: dict[str, np.ndarray]) -> list[int]:
    """The chunk tags of a batch's env columns, in column order."""
    return batch["actions"][0].tolist()


def test_put_drops_chunks_older_than_the_cap():
    queue = SampleQueue(capacity=10, batch_envs=4, staleness_cap=2)
    queue.put(chunk(1, 8), version=10)  # 10 - 8 = 2: at the cap, kept
    queue.put(chunk(2, 7), version=10)  # 10 - 7 = 3 > 2: dropped
    queue.put(chunk(3, [7, 9, 10]), version=10)  # the oldest step decides: dropped
    queue.put(chunk(4, [9, 10, 10]), version=10)
    assert queue.dropped_stale == 2 * FRAMES
    assert queue.dropped_full == 0
    assert len(queue) == 2
    batch = queue.take_batch(version=10)
    assert tags(batch) == [1, 1, 4, 4]
    assert len(queue) == 0


def test_chunks_that_go_stale_while_waiting_are_dropped_at_take():
    queue = SampleQueue(capacity=10, batch_envs=4, staleness_cap=1)
    queue.put(chunk(1, 0), version=0)
    queue.put(chunk(2, 1), version=1)
    queue.put(chunk(3, 2), version=2)
    assert queue.dropped_stale == 0 and len(queue) == 3
    # At version 3, chunk 1 (3 - 0 = 3) and chunk 2 (3 - 1 = 2) exceed the cap of 1.
    assert queue.take_batch(version=3) is None  # chunk 3 alone is 2 columns, not 4
    assert queue.dropped_stale == 2 * FRAMES
    assert len(queue) == 1
    queue.put(chunk(4, 3), version=3)
    batch = queue.take_batch(version=3)
    assert tags(batch) == [3, 3, 4, 4]
    assert queue.dropped_stale == 2 * FRAMES


def test_capacity_overflow_drops_the_oldest():
    queue = SampleQueue(capacity=3, batch_envs=4, staleness_cap=100)
    for tag in range(1, 6):
        queue.put(chunk(tag, 0), version=0)
    assert len(queue) == 3
    assert queue.dropped_full == 2 * FRAMES
    assert queue.dropped_stale == 0
    batch = queue.take_batch(version=0)
    assert tags(batch) == [3, 3, 4, 4]  # 1 and 2 were dropped, FIFO order kept
    assert len(queue) == 1
    # The column count stays right after drops: one chunk of 2 is not a batch of 4.
    assert queue.take_batch(version=0) is None
    queue.put(chunk(6, 0), version=0)
    assert tags(queue.take_batch(version=0)) == [5, 5, 6, 6]


def test_take_batch_concatenates_exactly_batch_envs_columns():
    queue = SampleQueue(capacity=10, batch_envs=6, staleness_cap=4)
    assert queue.take_batch(version=0) is None
    queue.put(chunk(1, 0), version=0)
    queue.put(chunk(2, 0), version=0)
    assert queue.take_batch(version=0) is None  # 4 of 6 columns
    assert len(queue) == 2  # nothing is consumed by a failed take
    queue.put(chunk(3, [0, 1, 1]), version=1)
    queue.put(chunk(4, 1), version=1)
    batch = queue.take_batch(version=1)
    assert batch is not None
    assert set(batch) == {"obs", "actions", "values", "rewards", "terminated", "versions"}
    assert batch["obs"].shape == (T + 1, 6, 4)
    assert batch["values"].shape == (T + 1, 6)
    for key in ("actions", "rewards", "terminated", "versions"):
        assert batch[key].shape == (T, 6), key
    assert batch["obs"].dtype == np.float32 and batch["actions"].dtype == np.int32
    assert batch["terminated"].dtype == bool and batch["versions"].dtype == np.int32
    assert tags(batch) == [1, 1, 2, 2, 3, 3]
    np.testing.assert_array_equal(batch["obs"][:, :, 0], np.tile([1, 1, 2, 2, 3, 3], (T + 1, 1)))
    np.testing.assert_array_equal(batch["versions"][:, 4], [0, 1, 1])
    assert len(queue) == 1
    assert queue.take_batch(version=1) is None


def test_chunks_of_different_widths_fill_the_batch():
    queue = SampleQueue(capacity=10, batch_envs=4, staleness_cap=4)
    queue.put(chunk(1, 0, n=1), version=0)
    queue.put(chunk(2, 0, n=3), version=0)
    queue.put(chunk(3, 0, n=1), version=0)
    batch = queue.take_batch(version=0)
    assert tags(batch) == [1, 2, 2, 2]
    assert len(queue) == 1


def test_chunks_acted_by_versions_a_restored_learner_never_made_are_dropped():
    # The learner died at version 12 and came back from its checkpoint at 10.
    queue = SampleQueue(capacity=10, batch_envs=2, staleness_cap=4)
    queue.put(chunk(1, [10, 11, 12]), version=10)
    queue.put(chunk(2, [9, 10, 10]), version=10)
    assert queue.dropped_stale == FRAMES
    assert tags(queue.take_batch(version=10)) == [2, 2]


def test_dropped_sample_counters_count_frames_like_samples_per_s():
    """`samples_dropped_*` and `frames_consumed` (`learner/samples_per_s`) share one unit."""
    wide = chunk(1, 0, n=5)
    rejects = RejectCounter()
    socket = zmq.Context.instance().socket(zmq.PULL)  # never bound: chunks come by `take`
    intake = SampleIntake(Binder(socket, SAMPLES.binder_receives, rejects),
                          SAMPLES.key(index=0),
                          {name: (a.shape, a.dtype) for name, a in wide.items()},
                          SampleQueue(capacity=1, batch_envs=5, staleness_cap=1), rejects)
    intake.take(wide, {}, version=0)
    intake.take(chunk(2, 0, n=5), {}, version=0)  # the queue is full: chunk 1 goes
    intake.take(chunk(3, 0, n=5), {}, version=2)  # 2 - 0 > 1: stale
    assert intake.take_batch(version=1) is not None
    counters = intake.counters()
    assert counters["frames_consumed"] == T * 5
    assert counters["samples_dropped_full"] == T * 5
    assert counters["samples_dropped_stale"] == T * 5
    intake.close()


def test_a_copy_forgets_what_the_old_parameters_acted():
    """A population member that copied its donor at version 7: the chunks its own
    parameters acted go, queued or arriving late; those of the copy stay."""
    queue = SampleQueue(capacity=8, batch_envs=2, staleness_cap=10)
    queue.put(chunk(1, 5), version=6)
    queue.put(chunk(2, [6, 7, 7]), version=7)
    queue.forget_before(7)
    assert len(queue) == 0 and queue.dropped_stale == 2 * T * 2
    queue.put(chunk(3, 6), version=8)  # acted before the copy, arriving late
    queue.put(chunk(4, 7), version=8)
    assert len(queue) == 1
    assert queue.take_batch(8)["actions"][0, 0] == 4
