"""Ape-X DQN as pure functions: n-step double-DQN targets and one prioritized update.

A batch is B transitions sampled from the replay servers (`srl_jax.dataflow.replay_spec`):
each row's observation and action, the rewards of its window of up to n steps, how
the window ended and the observation after it. The target is

    G = sum_k gamma^k r_k  +  gamma^steps * bootstrap

where the bootstrap is 0 after a termination and otherwise the target network's
value of the online network's best action at `next_obs` (double DQN, van Hasselt et
al. 2016); after a time-limit cut `next_obs` is the episode's final observation
where replay stores it (`EnvSpec.final_obs`), else the sampled row says `truncated`
and the bootstrap is the acting policy's value of it (`trunc_values`). The loss is
the importance-weighted Huber loss of the TD errors, whose magnitudes are the rows'
new priorities (Horgan et al. 2018). The target network lives in `TrainState.extra`
and is copied from the online one every `target_update_period` updates.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.dqn_config import DQNConfig
from learners.algorithms.prepare import scale_rewards
from learners.algorithms.train_state import TrainState, descend
from learners.models.networks import Policy, update_obs_stats
from srl_jax.dataflow.algorithms import Sizes, with_live


def nstep_targets(rewards: jax.Array, steps: jax.Array, terminated: jax.Array,
                  truncated: jax.Array, trunc_values: jax.Array, next_values: jax.Array,
                  gamma: float) -> jax.Array:
    """n-step targets [B] from rewards [B, n] (zero past `steps`), the window's end and
    the bootstrap values: 0 after a termination, `trunc_values` after a time-limit
    cut, `next_values` otherwise."""
    n = rewards.shape[1]
    discounts = gamma ** jnp.arange(n, dtype=jnp.float32)
    valid = jnp.arange(n)[None, :] < steps[:, None]
    returns = jnp.sum(jnp.where(valid, rewards, 0.0) * discounts, axis=1)
    bootstrap = jnp.where(truncated > 0, trunc_values, next_values) * (1.0 - terminated)
    return returns + gamma ** steps.astype(jnp.float32) * bootstrap


def make_optimizer(config: DQNConfig, sizes: Sizes) -> optax.GradientTransformation:
    """Adam's direction without its step size, which the update applies from
    `TrainState.hyper`."""
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.scale_by_adam(eps=config.adam_eps))


def init_target(params: Any, config: DQNConfig) -> Any:
    """The target network starts as a copy of the online one."""
    return {"target": params}


def q_learning_step(state: TrainState, params: Any, grads: Any,
                    optimizer: optax.GradientTransformation, config: Any,
                    metrics: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    """The optimizer step at the live step size, and the target network's copy every
    `config.target_update_period` updates (DQN's and R2D2's); `metrics` gain the
    gradient norm."""
    updates, opt_state = optimizer.update(grads, state.opt_state, params["net"])
    learning_rate = with_live(config, state.hyper).learning_rate
    params = {**params, "net": descend(params["net"], updates, learning_rate)}
    version = state.version + 1
    copy = version % config.target_update_period == 0
    new_target = jax.tree.map(lambda online, old: jnp.where(copy, online, old),
                              params, state.extra["target"])
    return (state._replace(params=params, opt_state=opt_state, version=version,
                           extra={"target": new_target}),
            {**metrics, "grad_norm": optax.tree.norm(grads)})


def make_update(policy: Policy, optimizer: optax.GradientTransformation, config: DQNConfig,
                sizes: Sizes) -> Any:
    """Pure (TrainState, batch) -> (TrainState, metrics); metrics include the rows' new
    `priorities` [B] (the learner sends them back to the replay servers). The `live`
    step size is read from `state.hyper` where it has it."""

    def q_values(params: Any, obs: jax.Array) -> jax.Array:
        q, _, _ = policy.apply(params, obs, jnp.zeros((obs.shape[0], 0), jnp.float32))
        return q

    def loss_fn(net: Any, params: Any, target: Any, batch: dict) -> tuple:
        online = {**params, "net": net}
        rows = jnp.arange(batch["actions"].shape[0])
        q = q_values(online, batch["obs"])[rows, batch["actions"]]
        next_target = q_values(target, batch["next_obs"])
        if config.double:
            best = jnp.argmax(q_values(online, batch["next_obs"]), -1)
        else:
            best = jnp.argmax(next_target, -1)
        next_values = jax.lax.stop_gradient(next_target[rows, best])
        rewards = scale_rewards(batch["rewards"], sizes.reward_scale, sizes.reward_clip)
        targets = nstep_targets(rewards, batch["steps"], batch["terminated"],
                                batch["truncated"], batch["trunc_values"], next_values,
                                config.gamma)
        errors = targets - q
        weights = batch["weights"] / jnp.max(batch["weights"])
        loss = jnp.mean(weights * optax.huber_loss(errors, delta=config.huber_delta))
        return loss, (errors, q)

    def update(state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        params = state.params
        if policy.normalize_obs:
            params = update_obs_stats(params, batch["obs"])
        target = {**params, "net": state.extra["target"]["net"]}
        (loss, (errors, q)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params["net"], params, target, batch)
        return q_learning_step(state, params, grads, optimizer, config, {
            "loss": loss, "q_mean": q.mean(), "td_error_abs": jnp.abs(errors).mean(),
            "priorities": jnp.abs(errors) + config.priority_epsilon})

    return update
