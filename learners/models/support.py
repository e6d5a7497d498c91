"""Value rescaling h(x) (Pohlen et al. 2018), which R2D2's Q-values learn under, and scalars
as categorical distributions over the integers -size..size after h (MuZero, appendix F),
which a MuZero model's reward and value heads predict and learn by cross-entropy: one
loss scale for returns of any size. Pure functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rescale(x: jax.Array, epsilon: float) -> jax.Array:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x."""
    return jnp.sign(x) * (jnp.sqrt(jnp.abs(x) + 1.0) - 1.0) + epsilon * x


def unrescale(x: jax.Array, epsilon: float) -> jax.Array:
    """h^-1, in closed form."""
    root = (jnp.sqrt(1.0 + 4.0 * epsilon * (jnp.abs(x) + 1.0 + epsilon)) - 1.0) / (2.0 * epsilon)
    return jnp.sign(x) * (jnp.square(root) - 1.0)


def two_hot(x: jax.Array, size: int) -> jax.Array:
    """[...] scalars -> [..., 2 size + 1] probabilities on the integers -size..size: the
    two integers around x (clipped to the support) share its mass, so that the mean is x."""
    x = jnp.clip(x, -size, size)
    low = jnp.floor(x)
    upper_weight = x - low
    index = (low + size).astype(jnp.int32)
    width = 2 * size + 1
    return (jax.nn.one_hot(index, width) * (1.0 - upper_weight)[..., None]
            + jax.nn.one_hot(jnp.minimum(index + 1, width - 1), width) * upper_weight[..., None])


def to_support(x: jax.Array, size: int, epsilon: float) -> jax.Array:
    """A scalar target's distribution over the support: two_hot of h(x)."""
    return two_hot(rescale(x, epsilon), size)


def from_support(logits: jax.Array, size: int, epsilon: float) -> jax.Array:
    """[..., 2 size + 1] logits -> [...] scalars: h^-1 of the distribution's mean."""
    support = jnp.arange(-size, size + 1, dtype=jnp.float32)
    return unrescale(jnp.sum(jax.nn.softmax(logits) * support, -1), epsilon)
