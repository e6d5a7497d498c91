"""R2D2 as pure functions (Kapturowski et al. 2019): recurrent double Q-learning on
replayed sequences with stored state, burn-in, n-step targets under value rescaling,
and sequence priorities.

A batch is B sequences sampled from the replay servers (`SEQUENCE_FIELDS`): T steps
of a chunk column (learner.r2d2's burn_in + trained_length), its T + 1 observations and
the recurrent state its actor acted from at the first step. Both networks unroll from
that stored state; the first `burn_in` steps only warm the online network's state (no
gradient, no loss) and the other `trained_length` train. Consecutive sequences of a
column start `period` steps apart, so each step trains in trained_length / period of
them (R2D2: 40, 80, 40; two). For each trained step t the target is

    h( sum_k gamma^k r_{t+k}  +  gamma^steps * bootstrap )

over a window of up to n steps that stops at an episode's end and at the sequence's
end; the bootstrap is 0 after a termination, the acting policy's value after a
time-limit cut, and otherwise the target network's value of the online network's
best action (double Q), both through h^-1 (value rescaling, Pohlen et al. 2018). The
loss is the importance-weighted squared TD error; a sequence's new priority mixes its
errors' max and mean (eta).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.dqn import q_learning_step
from learners.algorithms.prepare import scale_rewards
from learners.algorithms.r2d2_config import R2D2Config
from learners.algorithms.sequences import (
    REPLAYED_PER_SEQUENCE,
    episode_starts,
    time_major,
    warm_state,
)
from learners.algorithms.train_state import TrainState
from learners.models.networks import Policy, update_obs_stats
from learners.models.support import rescale, unrescale
from srl_jax.dataflow.algorithms import Sizes


def _ahead(x: jax.Array, k: int) -> jax.Array:
    """x[t + k] at t along the time axis, zero past the end."""
    return jnp.concatenate([x[k:], jnp.zeros_like(x[:k])])


def sequence_windows(rewards: jax.Array, ends: jax.Array, n: int,
                     gamma: float) -> tuple[jax.Array, jax.Array]:
    """(discounted rewards, steps) [T, B] of each step's window of up to n steps: its
    first steps up to and including the first that ends an episode, within the sequence."""
    T = rewards.shape[0]
    returns = jnp.zeros_like(rewards)
    steps = jnp.zeros(rewards.shape, jnp.int32)
    alive = jnp.ones(rewards.shape, bool)
    for k in range(n):
        take = alive & (jnp.arange(T) + k < T)[:, None]
        returns = returns + jnp.where(take, gamma ** k * _ahead(rewards, k), 0.0)
        steps = steps + take
        alive = take & ~_ahead(ends, k)
    return returns, steps


def sequence_targets(rewards: jax.Array, terminated: jax.Array, truncated: jax.Array,
                     trunc_values: jax.Array, next_values: jax.Array, n: int, gamma: float,
                     epsilon: float | None = None) -> jax.Array:
    """n-step targets [T, B] of T steps from their [T, B] fields and the bootstrap values
    [T + 1, B] of every observation; with `epsilon`, values and targets are in h-space
    (value rescaling, h's epsilon)."""
    ends = jnp.maximum(terminated, truncated) > 0
    returns, steps = sequence_windows(rewards, ends, n, gamma)
    at = jnp.arange(rewards.shape[0])[:, None] + steps  # the observation after the window
    last = at - 1

    def pick(x: jax.Array, index: jax.Array) -> jax.Array:
        return jnp.take_along_axis(x, index, axis=0)

    inverse = (lambda v: v) if epsilon is None else (lambda v: unrescale(v, epsilon))
    bootstrap = jnp.where(pick(truncated, last) > 0, inverse(pick(trunc_values, last)),
                          inverse(pick(next_values, at)))
    bootstrap = bootstrap * (1.0 - pick(terminated, last))
    target = returns + gamma ** steps.astype(jnp.float32) * bootstrap
    return target if epsilon is None else rescale(target, epsilon)


def sequence_priorities(errors: jax.Array, eta: float, epsilon: float) -> jax.Array:
    """Per sequence [B] from TD errors [T, B]: eta * max + (1 - eta) * mean of |error|."""
    magnitude = jnp.abs(errors)
    return eta * magnitude.max(0) + (1.0 - eta) * magnitude.mean(0) + epsilon


def sequence_gradients(policy: Policy, loss_fn: Callable, state: TrainState,
                       batch: dict) -> tuple[Any, jax.Array, Any, Any]:
    """(params, loss, its aux, gradients) of `loss_fn(net, params, target, seqs)` on a
    replayed sequence batch (R2D2's, QMIX's): time-major, the observation statistics
    updated, the target network's parameters beside the online ones."""
    seqs = time_major(batch, REPLAYED_PER_SEQUENCE)
    params = state.params
    if policy.normalize_obs:
        obs = seqs["obs"]
        params = update_obs_stats(params, obs.reshape(-1, *obs.shape[2:]))
    target = {**params, "net": state.extra["target"]["net"]}
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params["net"], params, target, seqs)
    return params, loss, aux, grads


def make_update(policy: Policy, optimizer: optax.GradientTransformation, config: R2D2Config,
                sizes: Sizes) -> Any:
    """Pure (TrainState, batch) -> (TrainState, metrics); metrics include the sequences'
    new `priorities` [B]. The `live` step size is read from `state.hyper`."""
    K = sizes.burn_in

    def loss_fn(net: Any, params: Any, target: Any, seqs: dict) -> tuple:
        online = {**params, "net": net}
        obs, actions = seqs["obs"], seqs["actions"]
        resets = episode_starts(seqs["terminated"], seqs["truncated"], obs.shape[0])
        warm = warm_state(policy, online, obs, seqs["state"], resets, K)
        q, _, _ = policy.unroll(online, obs[K:], warm, resets[K:])  # [T + 1 - K, B, A]
        q_target, _, _ = policy.unroll(target, obs, seqs["state"], resets)
        q_target = jax.lax.stop_gradient(q_target[K:])
        chooser = jax.lax.stop_gradient(q) if config.double else q_target
        best = jnp.argmax(chooser, -1)
        next_values = jnp.take_along_axis(q_target, best[..., None], -1)[..., 0]
        rewards = scale_rewards(seqs["rewards"][K:], sizes.reward_scale, sizes.reward_clip)
        targets = sequence_targets(rewards, seqs["terminated"][K:],
                                   seqs["truncated"][K:], seqs["trunc_values"][K:],
                                   next_values, config.n_step, config.gamma,
                                   config.rescaling_epsilon if config.value_rescaling
                                   else None)
        taken = jnp.take_along_axis(q[:-1], actions[K:, :, None], -1)[..., 0]
        errors = jax.lax.stop_gradient(targets) - taken
        weights = seqs["weights"] / jnp.max(seqs["weights"])
        loss = jnp.mean(weights[None, :] * 0.5 * jnp.square(errors))
        return loss, (errors, taken)

    def update(state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        params, loss, (errors, q), grads = sequence_gradients(policy, loss_fn, state, batch)
        return q_learning_step(state, params, grads, optimizer, config, {
            "loss": loss, "q_mean": q.mean(), "td_error_abs": jnp.abs(errors).mean(),
            "priorities": sequence_priorities(errors, config.priority_eta,
                                              config.priority_epsilon)})

    return update
