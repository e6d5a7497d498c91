"""PPO as pure functions: GAE, the clipped loss, and one update over a batch.

A batch is one [T+1, B] block of trajectory chunks (see srl_jax/dataflow/chunk_spec.py
for the fields). The update reads top to bottom: prepare the batch, compute
advantages with the acting policy's values (with a centralized critic, the
current critic's), then run `epochs` passes of `minibatches` clipped-objective
steps as nested scans; the learner jits it over its device mesh. What the
minibatches are (shuffled steps, or whole env columns of a recurrent policy
unrolled from their stored state after a burn-in), how the policy reads them,
and the masks and critic inputs come from learners/algorithms/prepare.py.
Rows of agents out of play (`active` false) weigh nothing in any mean. Nothing
here knows about processes or sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.ppo_config import PPOConfig
from learners.algorithms.prepare import (
    policy_over,
    prepare_actor_critic,
    rows,
    units,
)
from learners.algorithms.sequences import time_major
from learners.algorithms.train_state import Batch, TrainState, descend, weighted_mean
from learners.algorithms.value_norm import (
    denormalize,
    init_value_norm,
    normalize,
    update_value_norm,
)
from learners.models.distributions import Distribution
from learners.models.networks import Policy
from srl_jax.dataflow.algorithms import Sizes, with_live


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

    def backward(carry: jax.Array, step: tuple[jax.Array, jax.Array]
                 ) -> tuple[jax.Array, jax.Array]:
        delta, cont = step
        advantage = delta + gamma * lam * cont * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]),
                                 (deltas, continues), reverse=True)
    return advantages, advantages + values[:-1]


def ppo_loss(params: Any, apply_fn: Callable, dist: Distribution, obs: jax.Array,
             actions: jax.Array, old_logp: jax.Array, old_values: jax.Array,
             advantages: jax.Array, returns: jax.Array, active: jax.Array,
             config: PPOConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + value loss - entropy bonus over flat [N] samples; every mean
    (and the advantages' normalisation) is over the `active` ones only."""
    out, values = apply_fn(params, obs)
    logp, entropy = dist.log_prob(out, actions), dist.entropy(out)
    log_ratio = jnp.where(active > 0, logp - old_logp, 0.0)  # padding's actions: any
    ratio = jnp.exp(log_ratio)
    if config.normalize_advantages:
        mean = weighted_mean(advantages, active)
        std = jnp.sqrt(weighted_mean(jnp.square(advantages - mean), active))
        advantages = (advantages - mean) / (std + 1e-8)
    pg_loss = weighted_mean(jnp.maximum(
        -advantages * ratio,
        -advantages * jnp.clip(ratio, 1.0 - config.clip_coef, 1.0 + config.clip_coef),
    ), active)
    value_error = jnp.square(values - returns)
    if config.clip_value_loss:
        clipped = old_values + jnp.clip(values - old_values, -config.clip_coef, config.clip_coef)
        value_error = jnp.maximum(value_error, jnp.square(clipped - returns))
    value_loss = 0.5 * weighted_mean(value_error, active)
    entropy_mean = weighted_mean(entropy, active)
    loss = pg_loss + config.vf_coef * value_loss - config.ent_coef * entropy_mean
    info = {
        "loss": loss, "pg_loss": pg_loss, "value_loss": value_loss, "entropy": entropy_mean,
        "approx_kl": weighted_mean((ratio - 1.0) - log_ratio, active),
        "clip_frac": weighted_mean(jnp.abs(ratio - 1.0) > config.clip_coef, active),
    }
    return loss, info


def init_extra(params: Any, ppo: PPOConfig) -> Any:
    """The value normalization's statistics where `ppo.value_norm` (else no state)."""
    return {"value_norm": init_value_norm()} if ppo.value_norm else ()


def critic_labels(net: Any) -> Any:
    """'critic' for the parameters of the value MLP (`ActorCritic`'s "critic"), 'actor'
    for the others."""
    def label(path: tuple, _: Any) -> str:
        return "critic" if any(getattr(key, "key", None) == "critic" for key in path) \
            else "actor"

    return jax.tree_util.tree_map_with_path(label, net)


def make_optimizer(ppo: PPOConfig, sizes: Sizes) -> optax.GradientTransformation:
    """Adam's direction without its step size, which the update applies from
    `TrainState.hyper`; annealing is a factor going from 1 to 0 over the run. With
    `critic_optimizer` the value MLP's parameters get a clip and an Adam of their own,
    scaled by `critic_lr_scale`."""
    adam = optax.chain(optax.clip_by_global_norm(ppo.max_grad_norm),
                       optax.scale_by_adam(eps=1e-5))
    stages = [adam]
    if ppo.critic_optimizer:
        critic = optax.chain(optax.clip_by_global_norm(ppo.max_grad_norm),
                             optax.scale_by_adam(eps=1e-5), optax.scale(ppo.critic_lr_scale))
        stages = [optax.multi_transform({"actor": adam, "critic": critic}, critic_labels)]
    if ppo.anneal_lr:
        steps = sizes.total_updates * ppo.epochs * ppo.minibatches
        stages.append(optax.scale_by_schedule(optax.linear_schedule(1.0, 0.0, steps)))
    return optax.chain(*stages)


def make_update(policy: Policy, optimizer: optax.GradientTransformation, ppo: PPOConfig,
                sizes: Sizes) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The PPO update: (state, batch) -> (state, metrics); pure, for the learner to jit.
    The `live` fields are read from `state.hyper` where it has them."""

    def update(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        live = with_live(ppo, state.hyper)
        params, batch = prepare_actor_critic(state.params, batch, policy, sizes)
        norm = state.extra["value_norm"] if ppo.value_norm else None
        if norm is not None:  # the critic's outputs are normalized returns
            batch = batch._replace(values=denormalize(norm, batch.values),
                                   trunc_values=denormalize(norm, batch.trunc_values))
        advantages, returns = gae(batch.rewards, batch.values, batch.terminated,
                                  batch.truncated, batch.trunc_values, ppo.gamma, ppo.gae_lambda)
        raw_returns = returns
        if norm is not None:  # regress the returns as the updated statistics standardize them
            norm = update_value_norm(norm, returns, batch.active, ppo.value_norm_beta)
            returns = normalize(norm, returns)
            batch = batch._replace(values=normalize(norm, batch.values))
        samples = units(batch, policy.recurrent, advantages=advantages, returns=returns)
        n = len(samples["obs"])

        def loss_of_net(net: Any, mb: dict) -> tuple[jax.Array, dict]:
            net_params = {**params, "net": net}
            apply_fn, seqs = policy_over(policy, net_params, time_major(mb), sizes.burn_in)
            x = {name: rows(value) for name, value in seqs.items() if name != "state"}
            return ppo_loss(net_params, apply_fn, policy.dist, x["obs"], x["actions"], x["logp"],
                            x["values"], x["advantages"], x["returns"], x["active"], live)

        grad_fn = jax.grad(loss_of_net, has_aux=True)

        def minibatch_step(carry: tuple, mb: dict
                           ) -> tuple[tuple, tuple[dict[str, jax.Array], jax.Array]]:
            net, opt_state, stopped = carry

            def step(_: None) -> tuple:
                grads, info = grad_fn(net, mb)
                updates, new_opt_state = optimizer.update(grads, opt_state, net)
                return descend(net, updates, live.learning_rate), new_opt_state, info

            def skip(_: None) -> tuple:
                info = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, net, mb)[1])
                return net, opt_state, info

            if ppo.target_kl is None:  # never stops early: no branch to trace (half the trace)
                net, opt_state, info = step(None)
            else:
                net, opt_state, info = jax.lax.cond(stopped, skip, step, None)
            return (net, opt_state, stopped), (info, ~stopped)

        def epoch(carry: tuple, key: jax.Array
                  ) -> tuple[tuple, tuple[dict[str, jax.Array], jax.Array]]:
            order = jax.random.permutation(key, n)
            shuffled = jax.tree.map(
                lambda x: x[order].reshape(ppo.minibatches, n // ppo.minibatches, *x.shape[1:]),
                samples)
            (net, opt_state, stopped), (infos, ran) = jax.lax.scan(minibatch_step, carry,
                                                                   shuffled)
            if ppo.target_kl is not None:
                kl = jnp.sum(infos["approx_kl"] * ran) / jnp.maximum(ran.sum(), 1)
                stopped = stopped | (kl > ppo.target_kl)
            return (net, opt_state, stopped), (infos, ran)

        key, epoch_key = jax.random.split(state.key)
        (net, opt_state, _), (infos, ran) = jax.lax.scan(
            epoch, (params["net"], state.opt_state, jnp.zeros((), bool)),
            jax.random.split(epoch_key, ppo.epochs))
        steps = jnp.maximum(ran.sum(), 1)
        metrics = jax.tree.map(lambda x: jnp.sum(x * ran) / steps, infos)
        metrics["epochs_run"] = ran.sum() / ppo.minibatches
        metrics["advantage_mean"] = weighted_mean(advantages, batch.active)
        metrics["return_mean"] = weighted_mean(raw_returns, batch.active)
        new_state = state._replace(params={**params, "net": net}, opt_state=opt_state, key=key,
                                   version=state.version + 1,
                                   extra=state.extra if norm is None else {"value_norm": norm})
        return new_state, metrics

    return update
