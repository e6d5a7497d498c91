"""Value normalization (MAPPO's `ValueNorm`; Yu et al. 2022 list it first among their
recommendations): the critic learns returns standardized by running statistics, so that
its loss keeps one scale while returns grow or shrink, and one critic learning rate fits
every task. Pure functions over a dict of three scalars kept in `TrainState.extra`.

The statistics are exponential moving averages of the returns' mean and mean square,
debiased as Adam's moments (the first updates are not pulled towards 0). The critic's
outputs are in normalized units: the update turns the acting values back into returns
(`denormalize`) before computing advantages, then regresses the normalized returns.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learners.algorithms.train_state import weighted_mean

MIN_VAR = 1e-2
"""The variance never falls below this (MAPPO's clamp): constant returns stay finite."""


def init_value_norm() -> dict[str, jax.Array]:
    return {"mean": jnp.zeros((), jnp.float32), "mean_sq": jnp.zeros((), jnp.float32),
            "debias": jnp.zeros((), jnp.float32)}


def moments(stats: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """The debiased mean and variance (0 and 1 before any update)."""
    debias = jnp.maximum(stats["debias"], 1e-5)
    mean = jnp.where(stats["debias"] > 0, stats["mean"] / debias, 0.0)
    mean_sq = jnp.where(stats["debias"] > 0, stats["mean_sq"] / debias, 1.0)
    return mean, jnp.maximum(mean_sq - jnp.square(mean), MIN_VAR)


def update_value_norm(stats: dict[str, jax.Array], returns: jax.Array, weights: jax.Array,
                      beta: float) -> dict[str, jax.Array]:
    """Move the statistics towards the weighted batch of `returns` (weights: 0 or 1)."""
    return {"mean": beta * stats["mean"] + (1 - beta) * weighted_mean(returns, weights),
            "mean_sq": beta * stats["mean_sq"]
            + (1 - beta) * weighted_mean(jnp.square(returns), weights),
            "debias": beta * stats["debias"] + (1 - beta)}


def normalize(stats: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    mean, var = moments(stats)
    return (x - mean) / jnp.sqrt(var)


def denormalize(stats: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    mean, var = moments(stats)
    return x * jnp.sqrt(var) + mean
