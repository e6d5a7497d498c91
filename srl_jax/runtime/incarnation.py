"""Which start of a worker a process is: how often the run was resumed, and how often the
controller restarted this worker since.

The controller hands each worker its incarnation in its environment
(`SRL_JAX_RESUMES`, `SRL_JAX_RESTARTS`). Seeds derive from it, so that an actor
restarted by the controller, or started again by `--resume`, plays new episodes
instead of replaying those of its first start, while every seed stays fixed by
the config's seed, the worker and its incarnation: runs stay reproducible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

RESUMES_ENV = "SRL_JAX_RESUMES"
RESTARTS_ENV = "SRL_JAX_RESTARTS"


@dataclass(frozen=True)
class Incarnation:
    resumes: int = 0
    """How often the run was resumed before this start (`system/resumes`). A resume
    counts on from the metrics row it keeps, so a resume that left no checkpoint is
    counted again by the next, which replays its episodes; nothing learned from them
    was kept."""
    restarts: int = 0
    """How often the controller restarted this worker since the run, or its latest resume,
    started (the worker's `restarts` in status.json)."""

    def __post_init__(self) -> None:
        if self.resumes < 0 or self.restarts < 0:
            raise ValueError(f"an incarnation counts up from 0, not {self}")

    def to_env(self) -> dict[str, str]:
        """The variables that hand this incarnation to a worker process."""
        return {RESUMES_ENV: str(self.resumes), RESTARTS_ENV: str(self.restarts)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Incarnation:
        """The incarnation the controller gave this process (the first, when started by
        hand)."""
        counts = []
        for name in (RESUMES_ENV, RESTARTS_ENV):
            value = environ.get(name, "0")
            try:
                counts.append(int(value))
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a count") from None
        return cls(*counts)

    def seed(self, base: int) -> int:
        """The seed this start uses where its first start used `base` (>= 0): `base` itself
        in the first start of a fresh run, so its seeds are those runs had before
        incarnations counted; otherwise one derived from `base` and this incarnation."""
        if self == FIRST:
            return base
        return int(np.random.SeedSequence([base, self.resumes, self.restarts])
                   .generate_state(1)[0])


FIRST = Incarnation()
"""The first start of a worker in a fresh run."""
