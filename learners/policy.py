"""Acting: sample actions with their log-probabilities and values, jitted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from learners.ppo import categorical_logp_entropy


def make_act(apply_fn: Callable) -> Callable:
    """(params, obs [N, ...], key, counter) -> (action [N] int32, logp [N], value [N])."""

    def act(params: Any, obs: jax.Array, key: jax.Array, counter: jax.Array) -> tuple:
        logits, value = apply_fn(params, obs)
        action = jax.random.categorical(jax.random.fold_in(key, counter), logits)
        logp, _ = categorical_logp_entropy(logits, action)
        return action.astype(jnp.int32), logp, value

    return jax.jit(act)
