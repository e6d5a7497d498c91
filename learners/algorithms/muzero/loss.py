"""MuZero's K-step unrolled loss (Schrittwieser et al. 2020, appendix G).

From the representation of each sampled observation the dynamics unrolls the K actions
that followed; at every step the value head learns the n-step value target, the policy
head the search's policy, and from the first action on the reward head the observed
reward, each by cross-entropy (values and rewards on their supports). The gradient
entering each dynamics step is halved, and each unrolled step's loss weighs 1/K, as
MuZero scales them, so a deeper unroll does not swamp the first step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from learners.models.muzero_model import LogitFns
from learners.models.support import from_support, to_support


class UnrollTargets(NamedTuple):
    actions: jax.Array
    """[K, B] int32: the actions taken after each sampled observation."""
    rewards: jax.Array
    """[K, B]: the reward each of those actions got (0 past an episode's end)."""
    values: jax.Array
    """[K + 1, B]: the n-step value target of the sampled observation and the K after it
    (0 past an episode's end: an absorbing state)."""
    policies: jax.Array
    """[K + 1, B, A]: the search's policy at those observations."""
    policy_mask: jax.Array
    """[K + 1, B]: 1 where that observation is a state of the sampled episode that was
    searched (the policy target exists), else 0."""
    value_mask: jax.Array
    """[K + 1, B]: 1 where the value target is known (inside the episode and the sequence,
    or absorbing after a termination)."""
    reward_mask: jax.Array
    """[K, B]: as `value_mask`, for the rewards."""
    weights: jax.Array
    """[B]: each row's importance weight (prioritized replay), max-normalized."""


def scale_gradient(x: jax.Array, scale: float) -> jax.Array:
    """x forward; its gradient times `scale` backward."""
    return x * scale + jax.lax.stop_gradient(x) * (1.0 - scale)


def cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    return -jnp.sum(target * jax.nn.log_softmax(logits), -1)


def unrolled_loss(fns: LogitFns, params: Any, obs: jax.Array, targets: UnrollTargets,
                  support_size: int, epsilon: float,
                  value_coef: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of a batch of sampled observations [B, ...] and their targets.
    Metrics: each head's mean loss and `priorities` [B], |predicted value - target| of the
    sampled observation (MuZero's replay priority)."""
    K = targets.actions.shape[0]

    def on_support(x: jax.Array) -> jax.Array:
        return to_support(x, support_size, epsilon)

    latent, policy, value = fns.initial(params, obs)
    value_loss = cross_entropy(value, on_support(targets.values[0])) * targets.value_mask[0]
    policy_loss = cross_entropy(policy, targets.policies[0]) * targets.policy_mask[0]
    reward_loss = jnp.zeros_like(value_loss)
    first_value = from_support(value, support_size, epsilon)
    for k in range(K):
        latent = scale_gradient(latent, 0.5)
        latent, reward, policy, value = fns.recurrent(params, latent, targets.actions[k])
        reward_loss += (cross_entropy(reward, on_support(targets.rewards[k]))
                        * targets.reward_mask[k] / K)
        value_loss += (cross_entropy(value, on_support(targets.values[k + 1]))
                       * targets.value_mask[k + 1] / K)
        policy_loss += (cross_entropy(policy, targets.policies[k + 1])
                        * targets.policy_mask[k + 1] / K)
    per_row = reward_loss + value_coef * value_loss + policy_loss
    loss = jnp.mean(targets.weights * per_row)
    priorities = jax.lax.stop_gradient(jnp.abs(first_value - targets.values[0]))
    return loss, {"loss": loss, "value_loss": value_loss.mean(),
                  "reward_loss": reward_loss.mean(), "policy_loss": policy_loss.mean(),
                  "priorities": priorities}
