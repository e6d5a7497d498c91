"""The orthogonal initializer, without LAPACK for small layers.

`jax.nn.initializers.orthogonal` takes a QR decomposition, and lowering a QR on the
CPU loads LAPACK through `scipy.linalg`: 0.12-0.16 s of every JAX worker's start, on
the path to its first update, even when the compilation cache holds every program.
For layers of up to GRAM_SCHMIDT_MAX orthonormal vectors (every MLP and recurrent core
the shipped configs have) this one orthonormalizes the same normal draw by
Gram-Schmidt (twice over, as accurate as Householder for a full-rank draw), which gives
R a positive diagonal: the Q that jax's initializer keeps after its sign correction,
equal to it up to rounding. Larger layers take jax's QR.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

GRAM_SCHMIDT_MAX = 128
"""Up to this many vectors Gram-Schmidt's matrix-vector steps cost about what LAPACK's
QR does (2 to 5 ms on a CPU); past it they fall behind (a 3136 x 512 layer: 20x)."""


def orthonormal_columns(a: jax.Array) -> jax.Array:
    """Q of a = QR (a: [m, n], m >= n, full rank) with R's diagonal positive."""

    def column(j: jax.Array, q: jax.Array) -> jax.Array:
        v = a[:, j]
        for _ in range(2):  # the columns of q past j are still zero
            v = v - q @ (q.T @ v)
        return q.at[:, j].set(v / jnp.sqrt(jnp.sum(v * v)))

    return jax.lax.fori_loop(0, a.shape[1], column, jnp.zeros_like(a))


def orthogonal(scale: float = 1.0) -> Callable[..., jax.Array]:
    """A flax kernel initializer: orthonormal rows or columns (whichever side is
    smaller) times `scale`, over the last axis as the columns, as
    `jax.nn.initializers.orthogonal(scale)` draws them."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: DTypeLike = jnp.float32) -> jax.Array:
        rows, cols = math.prod(shape) // shape[-1], shape[-1]
        if min(rows, cols) > GRAM_SCHMIDT_MAX:
            return jax.nn.initializers.orthogonal(scale)(key, shape, dtype)
        draw = jax.random.normal(key, (max(rows, cols), min(rows, cols)), jnp.float32)
        q = orthonormal_columns(draw)
        return (scale * (q.T if rows < cols else q)).reshape(shape).astype(dtype)

    return init
