"""A sum tree in numpy: sampling in proportion to priorities, and updating them, in
O(log N) per item with every step vectorized over a batch."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Non-negative values at `size` leaves; `sample` finds leaves by prefix sum.

    Node i's children are 2i and 2i+1; the leaves sit at [base, base + size).
    Parents are recomputed from their children (never adjusted by deltas), so
    float rounding cannot accumulate across updates.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.base = 1 << max(0, (size - 1).bit_length())
        self.nodes = np.zeros(2 * self.base, np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def values(self, leaves: np.ndarray) -> np.ndarray:
        return self.nodes[self.base + leaves]

    def update(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set the leaves to the values (with repeated leaves, the last value wins)."""
        index = self.base + np.asarray(leaves, np.int64)
        if not len(index):
            return
        self.nodes[index] = values
        # A parent named twice is written twice with the same sum: no need to deduplicate.
        for _ in range(self.base.bit_length() - 1):
            index >>= 1
            self.nodes[index] = self.nodes[2 * index] + self.nodes[2 * index + 1]

    def find(self, targets: np.ndarray) -> np.ndarray:
        """The leaf whose prefix-sum interval holds each target in [0, total)."""
        node = np.ones(len(targets), np.int64)
        remaining = np.asarray(targets, np.float64).copy()
        while node[0] < self.base:
            left = self.nodes[2 * node]
            right = remaining >= left
            remaining -= np.where(right, left, 0.0)
            node = 2 * node + right
        return node - self.base

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` leaves drawn in proportion to their values, stratified over
        [0, total) as Ape-X does; never a leaf of value 0."""
        total = self.total
        targets = (np.arange(count) + rng.random(count)) * (total / count)
        leaves = self.find(np.minimum(targets, np.nextafter(total, 0.0)))
        empty = self.values(leaves) <= 0  # float rounding at an interval's edge
        if empty.any():
            leaves[empty] = self.find(np.zeros(int(empty.sum())))
        return leaves
