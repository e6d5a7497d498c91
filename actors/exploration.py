"""Ape-X's epsilon ladder: each actor env column explores at its own fixed rate.

Horgan et al. 2018 ("Distributed Prioritized Experience Replay") give actor i of
N the epsilon eps ** (1 + alpha * i / (N - 1)): a few columns explore a lot, most
act nearly greedily, and no schedule has to be annealed. Here the ladder runs
over every env column of every actor, so it does not depend on how columns are
grouped into actors. Pure numpy: actors never import JAX.
"""

from __future__ import annotations

import numpy as np


def epsilon_ladder(base: float, alpha: float, columns: int) -> np.ndarray:
    """Epsilon of each of `columns` columns, [columns] float64 (one column: `base`)."""
    if columns == 1:
        return np.array([base], np.float64)
    return base ** (1.0 + alpha * np.arange(columns) / (columns - 1))


def column_epsilons(base: float, alpha: float, actors: int, actor: int, split: int,
                    splits: int, width: int) -> np.ndarray:
    """The ladder's rungs for the `width` columns of split `split` of actor `actor`:
    columns are numbered actor by actor, split by split."""
    ladder = epsilon_ladder(base, alpha, actors * splits * width)
    start = (actor * splits + split) * width
    return ladder[start:start + width]


def explore(actions: np.ndarray, epsilons: np.ndarray, action_dim: int,
            rng: np.random.Generator, legal: np.ndarray | None = None) -> np.ndarray:
    """`actions` with each replaced, with its column's probability, by a uniform one: among
    the legal actions of its row where the env masks them (`legal` [N, A])."""
    random = rng.random(len(actions)) < epsilons
    if not random.any():
        return actions
    out = actions.copy()
    if legal is None:
        out[random] = rng.integers(0, action_dim, int(random.sum()), dtype=actions.dtype)
        return out
    allowed = legal[random] | ~legal[random].any(-1, keepdims=True)  # none legal: any
    # a uniform legal action: the first whose cumulative count passes a uniform draw
    counts = allowed.cumsum(-1)
    draws = rng.random(len(counts)) * counts[:, -1]
    out[random] = (counts > draws[:, None]).argmax(-1).astype(actions.dtype)
    return out
