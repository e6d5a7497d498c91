"""Action distributions as pure functions over the policy head's output.

The network's policy output is read by a `Distribution`: logits [N, A] for a
categorical policy; for a Gaussian one, means and log-stds side by side
[N, 2A]. A categorical policy with action masks reads logits masked by
`mask_logits`, so every use of it (sampling, log-probability, entropy, mode)
sees only legal actions. Continuous actions are sampled unbounded; actors clip them to the
action space, which is part of the environment, so the log-probability of the
sampled action is the one every algorithm needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Distribution(NamedTuple):
    sample: Callable[[jax.Array, jax.Array], jax.Array]
    """(key, policy output [N, ...]) -> actions [N, ...]."""
    log_prob: Callable[[jax.Array, jax.Array], jax.Array]
    """(policy output, actions) -> log-probabilities [N]."""
    entropy: Callable[[jax.Array], jax.Array]
    """policy output -> entropies [N]."""
    mode: Callable[[jax.Array], jax.Array]
    """policy output -> the most likely actions [N, ...] (for deterministic evaluation)."""


def _categorical_sample(key: jax.Array, logits: jax.Array) -> jax.Array:
    return jax.random.categorical(key, logits).astype(jnp.int32)


def _categorical_log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(log_probs, actions[..., None].astype(jnp.int32), -1)[..., 0]


def _categorical_entropy(logits: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits)
    # Masked actions have log-probability -inf and probability 0: they add nothing, and
    # replacing their -inf keeps 0 * -inf (NaN) out of the value and the gradient.
    finite = jnp.where(jnp.isfinite(log_probs), log_probs, 0.0)
    return -jnp.sum(jnp.exp(log_probs) * finite, -1)


def _categorical_mode(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, -1).astype(jnp.int32)


CATEGORICAL = Distribution(_categorical_sample, _categorical_log_prob, _categorical_entropy,
                           _categorical_mode)


def _split(out: jax.Array) -> tuple[jax.Array, jax.Array]:
    mean, log_std = jnp.split(out, 2, axis=-1)
    return mean, log_std


def _gaussian_sample(key: jax.Array, out: jax.Array) -> jax.Array:
    mean, log_std = _split(out)
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


def _gaussian_log_prob(out: jax.Array, actions: jax.Array) -> jax.Array:
    mean, log_std = _split(out)
    z = (actions - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi), -1)


def _gaussian_entropy(out: jax.Array) -> jax.Array:
    _, log_std = _split(out)
    return jnp.sum(log_std + 0.5 * (1.0 + math.log(2 * math.pi)), -1)


def _gaussian_mode(out: jax.Array) -> jax.Array:
    return _split(out)[0]


GAUSSIAN = Distribution(_gaussian_sample, _gaussian_log_prob, _gaussian_entropy, _gaussian_mode)


def _greedy_sample(key: jax.Array, q_values: jax.Array) -> jax.Array:
    return _categorical_mode(q_values)


def _certain_log_prob(q_values: jax.Array, actions: jax.Array) -> jax.Array:
    return jnp.zeros(q_values.shape[:-1], jnp.float32)


def _no_entropy(q_values: jax.Array) -> jax.Array:
    return jnp.zeros(q_values.shape[:-1], jnp.float32)


GREEDY = Distribution(_greedy_sample, _certain_log_prob, _no_entropy, _categorical_mode)
"""A Q-network's policy: the best-scoring action, with certainty. Actors explore around
it with their own epsilon (actors/exploration.py); the logged log-probability is 0."""


def mask_logits(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Logits [N, A] with the actions `mask` [N, A] marks illegal set to -inf: the
    categorical distribution of legal actions only (probability 0, log-probability
    -inf for the others; sampling, log-probabilities, entropy and their gradients stay
    finite for legal actions). A row with no legal action is left as it is, so padding
    rows cannot turn into NaN. A mask of width 0 masks nothing."""
    if mask.shape[-1] == 0:
        return logits
    legal = mask.astype(bool)
    legal = legal | ~legal.any(-1, keepdims=True)
    return jnp.where(legal, logits, -jnp.inf)


def distribution(continuous: bool) -> Distribution:
    return GAUSSIAN if continuous else CATEGORICAL
