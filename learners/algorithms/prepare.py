"""What PPO and IMPALA do to a batch before their own math, in one place.

An update first `prepare`s its [T+1, B] batch: the acted observations join the
normalisation statistics, rewards are scaled and clipped, and with a centralized
critic every agent column gets its critic inputs and the current critic's values
(learners/algorithms/critic.py). It then computes its targets and cuts the batch
into minibatches its own way: PPO shuffles `units` (whole env columns of a recurrent
policy, single steps otherwise), IMPALA splits the env columns. For each minibatch
of time-major sequences, `policy_over` gives the policy as the loss calls it:
unrolled from the stored state with resets after episode ends, the first `burn_in`
steps only warming the state (learners/algorithms/sequences.py), logits masked to
the legal actions, values from the centralized critic where there is one. Every
field keeps its `Batch` name throughout. Pure functions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from learners.algorithms.critic import with_critic_values
from learners.algorithms.sequences import (
    ApplyFn,
    after_burn_in,
    episode_starts,
    flat_unroll,
    warm_state,
)
from learners.algorithms.train_state import Batch
from learners.models.distributions import mask_logits
from learners.models.networks import Policy, update_obs_stats
from srl_jax.dataflow.algorithms import Sizes

Sequences = dict[str, jax.Array]
"""Time-major [L, b, ...] per-step fields under their `Batch` names (`obs`, and for
IMPALA `values` and `global_state`, one step longer: the bootstrap step), and the
stored `state` [1, b, S] the policy acted from at their first step."""

POLICY_INPUTS = ("obs", "terminated", "truncated", "action_mask", "global_state")
"""The per-step fields `policy_over` reads besides the stored state."""


def prepare(params: Any, batch: Batch, policy: Policy, reward_scale: float,
            reward_clip: float) -> tuple[Any, Batch]:
    """Fold the batch's active rows into the observation statistics; scale, then clip,
    its rewards.

    Clipping happens here, not in the env, so the returns actors report stay
    the raw game score.
    """
    if policy.normalize_obs:
        params = update_obs_stats(params, batch.obs[:-1], batch.active)
    return params, batch._replace(rewards=scale_rewards(batch.rewards, reward_scale,
                                                        reward_clip))


def scale_rewards(rewards: jax.Array, reward_scale: float, reward_clip: float) -> jax.Array:
    """Rewards times `reward_scale`, then clipped to [-reward_clip, reward_clip] (0: not)."""
    if reward_scale != 1.0:
        rewards = rewards * reward_scale
    if reward_clip > 0:
        rewards = jnp.clip(rewards, -reward_clip, reward_clip)
    return rewards


def prepare_actor_critic(params: Any, batch: Batch, policy: Policy,
                         sizes: Sizes) -> tuple[Any, Batch]:
    """`prepare`, then the centralized critic's per-column inputs (in `global_state`) and
    values; without one, the values as acted. Every field then has one column per agent."""
    params, batch = prepare(params, batch, policy, sizes.reward_scale, sizes.reward_clip)
    return params, with_critic_values(policy, params, batch)


def units(batch: Batch, recurrent: bool, **targets: jax.Array) -> dict[str, jax.Array]:
    """What an epoch shuffles, as [N, L, ...]: the T acted steps of every field the loss
    reads, with the per-step `targets` [T, B] (advantages, returns). A recurrent
    policy's units are its B env columns (L = T), each with its stored state; a
    feed-forward policy's the T * B single steps (L = 1), with no state."""
    T, B = batch.rewards.shape
    fields = {name: getattr(batch, name)[:T]
              for name in (*POLICY_INPUTS, "actions", "logp", "values", "active")}
    steps = {**fields, **targets}
    if recurrent:
        return {**{name: jnp.swapaxes(x, 0, 1) for name, x in steps.items()},
                "state": jnp.swapaxes(batch.state, 0, 1)}
    return {**{name: x.reshape(T * B, 1, *x.shape[2:]) for name, x in steps.items()},
            "state": jnp.zeros((T * B, 1, 0))}


def policy_over(policy: Policy, params: Any, seqs: Sequences,
                burn_in: int) -> tuple[ApplyFn, Sequences]:
    """The policy as a loss calls it on `seqs`, and `seqs` without their first `burn_in`
    steps (which only warm a recurrent state: a feed-forward policy has none to warm).

    The apply function answers the rows of `seqs["obs"]` after burn-in, time-major, as
    (policy output, value): unrolled from the stored state, restarting after every
    episode end; logits masked to each step's legal actions; values from the
    centralized critic where the policy has one.
    """
    obs = seqs["obs"]
    burn_in = burn_in if policy.recurrent else 0
    resets = episode_starts(seqs["terminated"], seqs["truncated"], len(obs))
    start = warm_state(policy, params, obs, seqs["state"][0], resets, burn_in)
    seqs = after_burn_in(seqs, burn_in)
    return acting(policy, flat_unroll(policy, start, resets[burn_in:]), seqs), seqs


def acting(policy: Policy, apply_fn: ApplyFn, seqs: Sequences) -> ApplyFn:
    """`apply_fn` with its logits masked to the legal actions of `seqs` and, with a
    centralized critic, its values those of the critic inputs of `seqs`. A bootstrap
    observation (valued, never acted on) keeps every action."""
    mask = seqs["action_mask"]
    if len(mask) < len(seqs["obs"]):
        mask = jnp.concatenate([mask, jnp.ones_like(mask[:1])])
    mask, critic_in = rows(mask), rows(seqs["global_state"])

    def apply(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out, values = apply_fn(params, obs)
        if policy.critic is not None:
            values = policy.critic(params, critic_in)
        return mask_logits(out, mask), values

    return apply


def rows(x: jax.Array) -> jax.Array:
    """[L, b, ...] -> [L * b, ...], time-major: the rows the apply functions answer."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
