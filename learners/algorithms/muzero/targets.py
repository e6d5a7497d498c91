"""MuZero's targets from replayed sequences (time-major): each of their first steps t starts
an unroll of K steps (a sampled position's window: its first step alone), with the
actions that followed, their rewards, n-step value targets bootstrapped from the values
given (the target network's), and the search's policies at t..t+K. Past the end of the
episode that t belongs to, a termination leaves an absorbing state (reward 0, value 0,
no policy target) and a time limit leaves nothing known (masked), as does the end of the
sequence. Pure functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learners.algorithms.muzero.loss import UnrollTargets
from learners.algorithms.r2d2 import sequence_targets


def value_targets(seqs: dict[str, jax.Array], n: int, gamma: float) -> jax.Array:
    """[T + 1, B]: the n-step targets of the T steps, bootstrapped from `values` [T + 1, B],
    then the last observation's own value (the sequence holds nothing after it)."""
    z = sequence_targets(seqs["rewards"], seqs["terminated"], seqs["truncated"],
                         seqs["trunc_values"], seqs["values"], n, gamma)
    return jnp.concatenate([z, seqs["values"][-1:]])


def first_ends(ends: jax.Array) -> jax.Array:
    """[T, B] int32: for each step, the first step at or after it that ends an episode
    (T where none does)."""
    T = ends.shape[0]
    first = jnp.full(ends.shape[1:], T, jnp.int32)
    rows = []
    for t in reversed(range(T)):
        first = jnp.where(ends[t], t, first)
        rows.append(first)
    return jnp.stack(rows[::-1])


def unroll_targets(seqs: dict[str, jax.Array], K: int, n: int, gamma: float,
                   starts: int | None = None) -> tuple[jax.Array, UnrollTargets]:
    """(observations [S * B, ...], their targets) of the first S = `starts` steps (None:
    every step) of the sequences `seqs`: obs and values (the bootstraps) [T + 1, B],
    actions, rewards, terminated, truncated and trunc_values [T, B], search policies
    [T, B, A] and importance weights [B]."""
    T, B = seqs["actions"].shape
    S = T if starts is None else starts
    z = value_targets(seqs, n, gamma)
    end = first_ends(jnp.maximum(seqs["terminated"], seqs["truncated"]) > 0)[:S, None, :]
    terminal = jnp.take_along_axis(seqs["terminated"] > 0,
                                   jnp.minimum(end, T - 1)[:, 0, :], 0)[:, None, :] & (end < T)
    columns = jnp.arange(B)[None, None, :]

    def at(x: jax.Array, index: jax.Array) -> jax.Array:
        return x[jnp.clip(index, 0, x.shape[0] - 1), columns]

    pos = jnp.arange(S)[:, None, None] + jnp.arange(K + 1)[None, :, None]  # [S, K + 1, 1]
    within = pos <= end  # end <= T: an observation of t's episode exists
    values = jnp.where(within, at(z, pos), 0.0)
    value_mask = within | terminal
    policy_mask = within & (pos < T)
    policies = jnp.where(policy_mask[..., None], at(seqs["search_policy"], pos), 0.0)
    step = pos[:, 1:] - 1  # the action after observation t + k - 1
    reward_within = step <= end
    rewards = jnp.where(reward_within & (step < T), at(seqs["rewards"], step), 0.0)
    reward_mask = jnp.where(reward_within, step < T, terminal)

    def rows(x: jax.Array) -> jax.Array:  # [S, k, B, ...] -> [k, S * B, ...]
        return jnp.swapaxes(x, 0, 1).reshape(x.shape[1], S * B, *x.shape[3:])

    targets = UnrollTargets(
        actions=rows(at(seqs["actions"], step).astype(jnp.int32)), rewards=rows(rewards),
        values=rows(values), policies=rows(policies),
        policy_mask=rows(policy_mask.astype(jnp.float32)),
        value_mask=rows(value_mask.astype(jnp.float32)),
        reward_mask=rows(reward_mask.astype(jnp.float32)),
        weights=jnp.tile(seqs["weights"], S))
    obs = seqs["obs"][:S]
    return obs.reshape(S * B, *obs.shape[2:]), targets
