"""The centralized critic's inputs and values (MAPPO's `network.critic: global`).

Actors carry each env's global state once per env step (the per-env chunk fields
`global_state` and `trunc_global_state`); the update hands it to every agent
column of its env, with the column's one-hot agent id where the policy acts for
several agents, and values every step with the current critic. Acting needs no
critic, so inference servers never see the global state. Pure functions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from learners.algorithms.train_state import Batch
from learners.models.networks import Policy


def critic_inputs(global_state: jax.Array, agents: int, ids: bool,
                  own_first: bool = False) -> jax.Array:
    """[R, E, G] per-env states -> [R, E * agents, G (+ agents)] per-column inputs.

    Columns are env-major (column e * agents + k is agent k of env e, as
    actors/env_families/multi_agent.py lays them out), so each state repeats `agents` times.
    `own_first`: the state is `agents` equal blocks, one per agent (every agent's
    observation side by side), and column k reads them from its own on: blocks
    k, k+1, ..., k-1, so every agent sees the team from where it stands, as its policy does.
    """
    rows, envs = global_state.shape[:2]
    if own_first:
        blocks = global_state.reshape(rows, envs, agents, -1)
        turned = jnp.stack([jnp.roll(blocks, -k, axis=2) for k in range(agents)], axis=2)
        x = turned.reshape(rows, envs * agents, -1)
    else:
        x = jnp.repeat(global_state, agents, axis=1)
    if ids:
        eye = jnp.tile(jnp.eye(agents, dtype=x.dtype), (envs, 1))
        x = jnp.concatenate([x, jnp.broadcast_to(eye, (rows, *eye.shape))], -1)
    return x


def with_critic_values(policy: Policy, params: Any, batch: Batch) -> Batch:
    """The batch with per-column critic inputs in `global_state` / `trunc_global_state`
    and the current critic's `values` / `trunc_values` of them (without a centralized
    critic: those fields emptied, the values as acted). Either way every field then
    has one column per agent. Values are targets' inputs: no gradient flows through them."""
    critic = policy.critic
    if critic is None:  # per-column too, so that every field splits alike
        T1, B = batch.values.shape
        return batch._replace(global_state=jnp.zeros((T1, B, 0)),
                              trunc_global_state=jnp.zeros((T1 - 1, B, 0)))
    def inputs(global_state: jax.Array) -> jax.Array:
        return critic_inputs(global_state, policy.critic_agents, policy.critic_ids,
                             policy.critic_own_first)

    states, final = inputs(batch.global_state), inputs(batch.trunc_global_state)

    def value(x: jax.Array) -> jax.Array:
        flat = critic(params, x.reshape(-1, x.shape[-1]))
        return jax.lax.stop_gradient(flat.reshape(x.shape[:2]))

    return batch._replace(global_state=states, trunc_global_state=final,
                          values=value(states), trunc_values=value(final))
