"""PPO as pure functions: GAE, the clipped loss, and one jitted update over a batch.

A batch is one [T+1, B] block of trajectory chunks (see actors/env_ring.py for
the fields). The update computes advantages with the acting policy's values,
then runs `epochs` passes of `minibatches` clipped-objective steps, all inside
one `jax.jit`. Nothing here knows about processes or sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from srl_jax.config import PPOConfig


class Batch(NamedTuple):
    obs: jax.Array  # [T+1, B, ...]
    actions: jax.Array  # [T, B]
    logp: jax.Array  # [T, B]
    values: jax.Array  # [T+1, B]
    rewards: jax.Array  # [T, B]
    terminated: jax.Array  # [T, B]
    truncated: jax.Array  # [T, B]
    trunc_values: jax.Array  # [T, B]


class TrainState(NamedTuple):
    """Everything the learner trains and saves: one pytree."""

    params: Any
    opt_state: Any
    key: jax.Array
    version: jax.Array  # int32 scalar: number of updates so far


def gae(rewards: jax.Array, values: jax.Array, terminated: jax.Array, truncated: jax.Array,
        trunc_values: jax.Array, gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation over [T, B] (values: [T+1, B]).

    A terminated step has no future; a truncated step bootstraps from the value
    of its final observation (`trunc_values`), not from the next observation,
    which already belongs to the next episode. Either way the recursion stops.
    """
    next_values = jnp.where(truncated, trunc_values, values[1:])
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values[:-1]
    continues = 1.0 - jnp.maximum(terminated, truncated)

    def backward(carry: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple:
        delta, cont = step
        advantage = delta + gamma * lam * cont * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]),
                                 (deltas, continues), reverse=True)
    return advantages, advantages + values[:-1]


def categorical_logp_entropy(logits: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    log_probs = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(log_probs, actions[..., None].astype(jnp.int32), -1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, -1)
    return logp, entropy


def ppo_loss(params: Any, apply_fn: Callable, obs: jax.Array, actions: jax.Array,
             old_logp: jax.Array, advantages: jax.Array, returns: jax.Array,
             config: PPOConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + value loss - entropy bonus over flat [N] samples."""
    logits, values = apply_fn(params, obs)
    logp, entropy = categorical_logp_entropy(logits, actions)
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = jnp.maximum(
        -advantages * ratio,
        -advantages * jnp.clip(ratio, 1.0 - config.clip_coef, 1.0 + config.clip_coef),
    ).mean()
    value_loss = 0.5 * jnp.square(values - returns).mean()
    entropy_mean = entropy.mean()
    loss = pg_loss + config.vf_coef * value_loss - config.ent_coef * entropy_mean
    info = {
        "loss": loss, "pg_loss": pg_loss, "value_loss": value_loss, "entropy": entropy_mean,
        "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "clip_frac": (jnp.abs(ratio - 1.0) > config.clip_coef).mean(),
    }
    return loss, info


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.adam(config.learning_rate, eps=1e-5))


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     seed: int) -> TrainState:
    return TrainState(params, optimizer.init(params), jax.random.key(seed + 1),
                      jnp.zeros((), jnp.int32))


def make_update(apply_fn: Callable, optimizer: optax.GradientTransformation,
                config: PPOConfig) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The jitted PPO update: (state, batch) -> (state, metrics)."""

    def update(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        advantages, returns = gae(batch.rewards, batch.values, batch.terminated,
                                  batch.truncated, batch.trunc_values,
                                  config.gamma, config.gae_lambda)
        T, B = batch.actions.shape
        n = T * B
        flat = {
            "obs": batch.obs[:-1].reshape(n, *batch.obs.shape[2:]),
            "actions": batch.actions.reshape(n), "logp": batch.logp.reshape(n),
            "advantages": advantages.reshape(n), "returns": returns.reshape(n),
        }
        grad_fn = jax.grad(ppo_loss, has_aux=True)

        def minibatch_step(carry: tuple, mb: dict) -> tuple:
            params, opt_state = carry
            grads, info = grad_fn(params, apply_fn, mb["obs"], mb["actions"], mb["logp"],
                                  mb["advantages"], mb["returns"], config)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), info

        def epoch(carry: tuple, key: jax.Array) -> tuple:
            order = jax.random.permutation(key, n)
            shuffled = jax.tree.map(
                lambda x: x[order].reshape(config.minibatches, -1, *x.shape[1:]), flat)
            return jax.lax.scan(minibatch_step, carry, shuffled)

        key, epoch_key = jax.random.split(state.key)
        (params, opt_state), infos = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(epoch_key, config.epochs))
        metrics = jax.tree.map(jnp.mean, infos)
        metrics["advantage_mean"] = advantages.mean()
        metrics["return_mean"] = returns.mean()
        return TrainState(params, opt_state, key, state.version + 1), metrics

    return jax.jit(update, donate_argnums=0)
