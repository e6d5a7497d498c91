"""Recurrent policies in the learner: where episodes start inside a chunk, burn-in,
and the unrolled network in the form the losses call it.

A chunk column is a sequence of T steps that may hold several episodes: its
stored state (`Batch.state`) is the one the actor acted from at its first step,
and the core restarts from zeros after every step that ended an episode
(termination or truncation), as the actor's did. Without a core these reduce to
the feed-forward network on every row.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from learners.models.networks import Policy

ApplyFn = Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]
"""(params, obs [N, ...]) -> (policy output [N, ...], value [N]): what the losses call."""


def episode_starts(terminated: jax.Array, truncated: jax.Array, steps: int) -> jax.Array:
    """[steps, B] resets: true at step t > 0 where step t - 1 ended an episode. Step 0
    never resets: the stored state already starts its episode when one starts there."""
    ended = jnp.maximum(terminated, truncated) > 0
    return jnp.concatenate([jnp.zeros_like(ended[:1]), ended])[:steps]


def warm_state(policy: Policy, params: Any, obs: jax.Array, state: jax.Array,
               resets: jax.Array, burn_in: int) -> jax.Array:
    """The state after the first `burn_in` steps of [T, B] `obs`, unrolled from `state`;
    no gradient flows back through it (R2D2's burn-in)."""
    if burn_in == 0:
        return state
    _, _, warm = policy.unroll(params, obs[:burn_in], state, resets[:burn_in])
    return jax.lax.stop_gradient(warm)


REPLAYED_PER_SEQUENCE = ("state", "weights")
"""The fields of a replayed batch that hold one value per sequence, with no time axis:
its stored `state`, its importance `weights`."""


def time_major(batch: Mapping[str, jax.Array],
               per_sequence: Collection[str] = ()) -> dict[str, jax.Array]:
    """Sequences [B, T (+ 1), ...] as [T (+ 1), B, ...], but for the fields named in
    `per_sequence` (a replayed batch's `REPLAYED_PER_SEQUENCE`), which have no time axis;
    PPO's minibatches of units carry every field per step."""
    return {name: value if name in per_sequence else jnp.swapaxes(value, 0, 1)
            for name, value in batch.items()}


def after_burn_in(seqs: Mapping[str, jax.Array], burn_in: int) -> dict[str, jax.Array]:
    """Time-major fields without their first `burn_in` steps (every per-step field; the
    stored `state` is not per step and stays)."""
    return {name: value if name == "state" else value[burn_in:]
            for name, value in seqs.items()}


def flat_unroll(policy: Policy, state: jax.Array, resets: jax.Array) -> ApplyFn:
    """The losses' `apply_fn` over the T * B rows (time-major) of [T, B] sequences:
    the policy unrolled from `state` [B, S] with `resets` [T, B]."""
    T, B = resets.shape

    def apply(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out, values, _ = policy.unroll(params, obs.reshape(T, B, *obs.shape[1:]), state, resets)
        return out.reshape(T * B, *out.shape[2:]), values.reshape(T * B)

    return apply
