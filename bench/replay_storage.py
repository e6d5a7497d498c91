"""Replay server storage throughput and memory: inserts/s, samples/s, bytes per transition.

What it measures
----------------
The `ReplayBuffer` a replay server runs (`replay/buffer.py`), in this process,
without sockets: the cost of its numpy work per chunk inserted and per batch
sampled, and what a transition costs in memory. Cases:

- ``cartpole``: float32 [4] observations, chunks of T=16 steps x 8 columns, the
  shipped `cartpole_dqn` settings (capacity 50,000, alpha 0.6, beta 0.4, batches of
  128 rows with 3-step windows).
- ``atari``: uint8 [84, 84, 4] stacked frames, chunks of T=20 x 4 columns, capacity
  100,000, batches of 512 x 3 (`atari_pong_apex`'s). Chunks are made as a frame
  stack makes them: each observation shifts in one new frame, an episode starts
  (4 copies of one frame) every 1,000 steps on average. Run once with frames stored
  once each (`frame stack 4`, the server's way) and once with whole observations.

Per case the buffer is filled to capacity first (memory touched, the ring wrapping),
then ``--repeats`` times: ``--chunks`` inserts timed together, and ``--batches``
samples each followed by a priority update of its rows (as the learner sends back).
``inserts/s`` counts transitions; ``samples/s`` counts sampled rows including their
priority updates. ``B/transition`` is the preallocated storage over the capacity.
Medians over repeats.

    .venv/bin/python -m bench.replay_storage
    .venv/bin/python -m bench.replay_storage --cases atari --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from replay.buffer import ReplayBuffer
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec

CASES = {
    # name: (spec, T, columns, capacity, rows, window, frame stacks to compare)
    "cartpole": (EnvSpec((4,), np.dtype(np.float32), 2, False), 16, 8, 50_000, 128, 3, (1,)),
    "atari": (EnvSpec((84, 84, 4), np.dtype(np.uint8), 6, False), 20, 4, 100_000, 512, 3,
              (4, 1)),
}


class ChunkSource:
    """Chunks of a case's shape; stacked frames continue across steps as a wrapper's do."""

    def __init__(self, spec: EnvSpec, T: int, columns: int, seed: int) -> None:
        self.spec, self.T, self.columns = spec, T, columns
        self.rng = np.random.default_rng(seed)
        self.stacked = len(spec.obs_shape) == 3
        if self.stacked:
            self.last = np.repeat(self._frames(columns), 4, -1)

    def _frames(self, n: int) -> np.ndarray:
        return self.rng.integers(0, 255, (n, *self.spec.obs_shape[:-1], 1), np.uint8)

    def chunk(self) -> dict[str, np.ndarray]:
        chunk = empty_chunk(self.T, self.columns, self.spec)
        chunk["actions"][:] = self.rng.integers(0, self.spec.action_dim, chunk["actions"].shape)
        chunk["rewards"][:] = self.rng.normal(size=chunk["rewards"].shape)
        chunk["terminated"][:] = self.rng.random(chunk["terminated"].shape) < 1e-3
        if not self.stacked:
            chunk["obs"][:] = self.rng.normal(size=chunk["obs"].shape)
            return chunk
        chunk["obs"][0] = self.last
        for t in range(1, self.T + 1):
            stack = np.concatenate([chunk["obs"][t - 1][..., 1:], self._frames(self.columns)],
                                   -1)
            reset = chunk["terminated"][t - 1]
            stack[reset] = np.repeat(self._frames(int(reset.sum())), 4, -1)
            chunk["obs"][t] = stack
        self.last = chunk["obs"][-1].copy()
        return chunk


def measure(case: str, frame_stack: int, chunks: int, batches: int, repeats: int) -> dict:
    spec, T, columns, capacity, rows, window, _ = CASES[case]
    source = ChunkSource(spec, T, columns, seed=0)
    pool = [source.chunk() for _ in range(32)]
    buffer = ReplayBuffer(capacity, T, columns, spec, frame_stack, 0.6, 0.4, seed=0)
    for i in range(capacity // (T * columns) + 1):
        buffer.insert(pool[i % len(pool)])
    insert_rates, sample_rates = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(chunks):
            buffer.insert(pool[i % len(pool)])
        insert_rates.append(chunks * T * columns / (time.perf_counter() - start))
        rng = np.random.default_rng(1)
        start = time.perf_counter()
        for _ in range(batches):
            batch = buffer.sample(rows, window)
            buffer.update_priorities(batch["slots"], batch["generations"],
                                     rng.random(rows) + 1e-6)
        sample_rates.append(batches * rows / (time.perf_counter() - start))
    return {"case": case, "frame_stack": frame_stack, "capacity": capacity,
            "storage_mb": buffer.nbytes / 2**20,
            "bytes_per_transition": buffer.nbytes / capacity,
            "inserts_per_s": statistics.median(insert_rates),
            "samples_per_s": statistics.median(sample_rates)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<9} {'storage':<14} {'capacity':>9} {'MiB':>8} {'B/transition':>13} "
          f"{'inserts/s':>11} {'samples/s':>11}")
    for case in args.cases:
        for stack in CASES[case][-1]:
            r = measure(case, stack, args.chunks, args.batches, args.repeats)
            storage = f"frames x{stack}" if stack > 1 else "whole obs"
            print(f"{case:<9} {storage:<14} {r['capacity']:>9,} {r['storage_mb']:>8.1f} "
                  f"{r['bytes_per_transition']:>13,.0f} {r['inserts_per_s']:>11,.0f} "
                  f"{r['samples_per_s']:>11,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
