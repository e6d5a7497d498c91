"""Acting: sample actions with their log-probabilities and values, jitted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from learners.networks import Policy


def make_act(policy: Policy) -> Callable:
    """(params, obs [N, ...], key, counter) -> (action [N, ...], logp [N], value [N])."""

    def act(params: Any, obs: jax.Array, key: jax.Array, counter: jax.Array) -> tuple:
        out, value = policy.apply(params, obs)
        action = policy.dist.sample(jax.random.fold_in(key, counter), out)
        return action, policy.dist.log_prob(out, action), value

    return jax.jit(act)
