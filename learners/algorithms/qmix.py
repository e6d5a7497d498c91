"""QMIX as pure functions (Rashid et al. 2018): the team's TD targets on replayed team
sequences, through the monotonic mixer.

A batch is B teams of n agents' sequences (`Replay.teams`: n consecutive rows per
team, each row a column's T steps, its T + 1 observations and stored recurrent state,
with the env's global state, the legal actions and which agents were in play). Both
the online and the target agents unroll as R2D2's do (burn-in included); each agent's
Q of its action, zero for an agent out of play, goes through the mixer with the
global state of the step, which gives Q_tot. For each trained step t the target is

    sum_k gamma^k r_{t+k}  +  gamma^steps * bootstrap

with the team's reward (the mean of the rewards of the agents in play), over a window
of up to n steps that stops at the team's episode end; the bootstrap is 0 after a
termination (every agent done), and otherwise the target mixer of the online agents'
best legal actions scored by the target agents (double Q): at a time-limit cut, at the
cut step's own observation, whose value stands in for the final one's. The acting
values of the final observations (`trunc_values`) are maxima over every action, the
illegal ones too, which no target trains and which may grow without bound. A chunk's
last step is trained by the next chunk (QMIX's declaration repeats burn-in + 1 steps):
its bootstrap needs the legal actions of the observation after it, which arrive with
that step. The loss is the importance-weighted
squared TD error of Q_tot; a team's priority mixes its errors' max and mean (eta).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.dqn import q_learning_step
from learners.algorithms.prepare import scale_rewards
from learners.algorithms.qmix_config import QMixConfig
from learners.algorithms.r2d2 import sequence_gradients, sequence_priorities, sequence_targets
from learners.algorithms.sequences import episode_starts, warm_state
from learners.algorithms.train_state import TrainState
from learners.models.distributions import mask_logits
from learners.models.networks import Policy
from srl_jax.dataflow.algorithms import Sizes


def by_team(x: jax.Array, agents: int) -> jax.Array:
    """Time-major columns [T, B * n, ...] (team-major, agents consecutive) as
    [T, B, n, ...]."""
    return x.reshape(x.shape[0], -1, agents, *x.shape[2:])


def team_flags(terminated: jax.Array, truncated: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(terminated, truncated) [T, B] of teams from their agents' [T, B, n]: the team's
    episode ends in a terminal state where every agent's does (an agent out of play is
    terminated on every step), and is cut where any agent's is and it did not end."""
    ended = jnp.all(terminated > 0, -1)
    cut = jnp.any(truncated > 0, -1) & ~ended
    return ended.astype(jnp.float32), cut.astype(jnp.float32)


def team_rewards(rewards: jax.Array, active: jax.Array) -> jax.Array:
    """The team's reward [T, B]: the mean of its agents' [T, B, n] over those in play
    (a shared reward as it is; 0 where none plays)."""
    return jnp.sum(rewards * active, -1) / jnp.maximum(jnp.sum(active, -1), 1.0)


def team_targets(rewards: jax.Array, active: jax.Array, terminated: jax.Array,
                 truncated: jax.Array, cut_values: jax.Array, next_values: jax.Array,
                 n: int, gamma: float) -> jax.Array:
    """The teams' n-step targets [T, B] from their agents' rewards, activity and flags
    [T, B, agents], the bootstrap at each time-limit cut [T, B] and the values of every
    observation [T + 1, B] (`sequence_targets` on the team's reward and flags)."""
    ended, cut = team_flags(terminated, truncated)
    return sequence_targets(team_rewards(rewards, active), ended, cut, cut_values,
                            next_values, n, gamma)


def chosen(q: jax.Array, actions: jax.Array) -> jax.Array:
    """Q [..., A] of `actions` [...]."""
    return jnp.take_along_axis(q, actions[..., None], -1)[..., 0]


def make_update(policy: Policy, optimizer: optax.GradientTransformation, config: QMixConfig,
                sizes: Sizes) -> Any:
    """Pure (TrainState, batch) -> (TrainState, metrics); metrics include each row's new
    `priorities` [B * n] (its team's, for every agent row)."""
    K, n = sizes.burn_in, policy.critic_agents
    module = policy.network

    def mix(net: Any, q: jax.Array, state: jax.Array) -> jax.Array:
        """Q_tot [T, B] of agent Qs [T, B * n] in the global states [T, B * n, G] (each
        env's repeated for its agents' columns)."""
        q, state = by_team(q, n), by_team(state, n)[:, :, 0]
        T, B = q.shape[:2]
        mixed = module.apply(net, q.reshape(T * B, n), state.reshape(T * B, -1),
                             method="mix")
        return mixed.reshape(T, B)

    def loss_fn(net: Any, params: Any, target: Any, seqs: Mapping[str, jax.Array]) -> tuple:
        online = {**params, "net": net}
        obs = seqs["obs"]
        T = seqs["actions"].shape[0]
        resets = episode_starts(seqs["terminated"], seqs["truncated"], obs.shape[0])
        warm = warm_state(policy, online, obs, seqs["state"], resets, K)
        q, _, _ = policy.unroll(online, obs[K:T], warm, resets[K:T])  # obs K .. T - 1
        q_target, _, _ = policy.unroll(target, obs[:T], seqs["state"], resets[:T])
        q_target = jax.lax.stop_gradient(q_target[K:])
        masks, active = seqs["action_mask"][K:], seqs["active"][K:]
        states = seqs["global_state"][K:T]
        chooser = jax.lax.stop_gradient(q) if config.double else q_target
        best = jnp.argmax(mask_logits(chooser, masks), -1)
        next_values = mix(target["net"], chosen(q_target, best) * active, states)
        steps = slice(K, T - 1)  # the trained steps: the last one's bootstrap is not here
        q_tot = mix(net, chosen(q[:-1], seqs["actions"][steps]) * active[:-1], states[:-1])
        rewards = scale_rewards(seqs["rewards"][steps], sizes.reward_scale, sizes.reward_clip)
        targets = team_targets(
            by_team(rewards, n), by_team(seqs["active"][steps], n),
            by_team(seqs["terminated"][steps], n), by_team(seqs["truncated"][steps], n),
            next_values[:-1], next_values, config.n_step, config.gamma)
        errors = jax.lax.stop_gradient(targets) - q_tot
        weights = seqs["weights"][::n]
        loss = jnp.mean(weights[None, :] / jnp.max(weights) * 0.5 * jnp.square(errors))
        return loss, (errors, q_tot)

    def update(state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        params, loss, (errors, q_tot), grads = sequence_gradients(policy, loss_fn, state,
                                                                  batch)
        priorities = sequence_priorities(errors, config.priority_eta, config.priority_epsilon)
        return q_learning_step(state, params, grads, optimizer, config, {
            "loss": loss, "q_mean": q_tot.mean(), "td_error_abs": jnp.abs(errors).mean(),
            "priorities": jnp.repeat(priorities, n)})

    return update
