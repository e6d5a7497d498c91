"""What every algorithm trains on and keeps: the batch and the train state pytrees."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from learners.networks import Policy, update_obs_stats


class Batch(NamedTuple):
    """A [T+1, B] block of trajectory chunks (fields as in actors/env_ring.py)."""

    obs: jax.Array  # [T+1, B, ...]
    actions: jax.Array  # [T, B, ...]
    logp: jax.Array  # [T, B]
    values: jax.Array  # [T+1, B]
    rewards: jax.Array  # [T, B]
    terminated: jax.Array  # [T, B], float
    truncated: jax.Array  # [T, B], float
    trunc_values: jax.Array  # [T, B]


class TrainState(NamedTuple):
    """Everything the learner trains and saves: one pytree.

    `params` are the policy parameters as published (network weights and
    observation statistics); the optimizer only sees `params["net"]`.
    """

    params: Any
    opt_state: Any
    key: jax.Array
    version: jax.Array  # int32 scalar: number of updates so far


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     seed: int) -> TrainState:
    return TrainState(params, optimizer.init(params["net"]), jax.random.key(seed + 1),
                      jnp.zeros((), jnp.int32))


def prepare(params: Any, batch: Batch, policy: Policy, reward_scale: float,
            reward_clip: float) -> tuple[Any, Batch]:
    """Fold the batch into the observation statistics; scale, then clip, its rewards.

    Clipping happens here, not in the env, so the returns actors report stay
    the raw game score.
    """
    if policy.normalize_obs:
        params = update_obs_stats(params, batch.obs[:-1])
    rewards = batch.rewards
    if reward_scale != 1.0:
        rewards = rewards * reward_scale
    if reward_clip > 0:
        rewards = jnp.clip(rewards, -reward_clip, reward_clip)
    return params, batch._replace(rewards=rewards)
