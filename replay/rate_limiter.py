"""Reverb's SampleToInsertRatio on one replay server: inserts and samples kept near a ratio.

`diff` is samples_per_insert times the transitions inserted minus the transitions
sampled. Sampling starts once the server holds `min_size` and may go on while
diff stays at or above `min_size * spi - error_buffer`; inserting may go on while
diff stays at or below `min_size * spi + error_buffer`. Each check is made before
the move (a chunk of inserts or a batch of samples), so either side overshoots by
at most one of its moves, and one side can always move: no deadlock.
"""

from __future__ import annotations


def error_buffer(min_size: int, tolerance: float, samples_per_insert: float) -> float:
    """Acme's tolerance rate: how far diff may stray either way from its offset."""
    return min_size * tolerance * samples_per_insert


class RateLimiter:
    """Gates for a server's inserts and samples (`samples_per_insert` 0: only min_size)."""

    def __init__(self, min_size: int, samples_per_insert: float, error: float) -> None:
        self.min_size = min_size
        self.samples_per_insert = samples_per_insert
        offset = min_size * samples_per_insert
        self.min_diff = offset - error
        self.max_diff = offset + error
        self.diff = 0.0

    def can_insert(self) -> bool:
        return not self.samples_per_insert or self.diff <= self.max_diff

    def can_sample(self, size: int) -> bool:
        return size >= self.min_size and (not self.samples_per_insert
                                          or self.diff >= self.min_diff)

    def inserted(self, transitions: int) -> None:
        self.diff += transitions * self.samples_per_insert

    def sampled(self, transitions: int) -> None:
        self.diff -= transitions
