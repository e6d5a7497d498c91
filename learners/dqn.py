"""Ape-X DQN as pure functions: n-step double-DQN targets and one prioritized update.

A batch is B transitions sampled from the replay servers (`srl_jax.replay_spec`):
each row's observation and action, the rewards of its window of up to n steps, how
the window ended and the observation after it. The target is

    G = sum_k gamma^k r_k  +  gamma^steps * bootstrap

where the bootstrap is 0 after a termination, the acting policy's value of the
final observation after a time-limit cut (it is not stored), and otherwise the
target network's value of the online network's best action at `next_obs` (double
DQN, van Hasselt et al. 2016). The loss is the importance-weighted Huber loss of
the TD errors, whose magnitudes are the rows' new priorities (Horgan et al. 2018).
The target network lives in `TrainState.extra` and is copied from the online one
every `target_update_period` updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms import Algorithm, Sizes, with_live
from learners.networks import Policy, update_obs_stats
from learners.train_state import TrainState, descend, scale_rewards
from srl_jax.config import ConfigError


@dataclass
class DQNConfig:
    """DQN hyperparameters: the `learner.dqn` section of the experiment config."""

    learning_rate: float = 2.5e-4
    """Adam step size."""
    adam_eps: float = 1.5e-4
    """Adam epsilon (Ape-X and Rainbow use 1.5e-4, not 1e-8)."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Steps of each sampled window: the n of the n-step target."""
    target_update_period: int = 2500
    """Updates between copies of the online network into the target network."""
    huber_delta: float = 1.0
    """Huber loss: quadratic within this TD error, linear beyond."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip (Ape-X: 40)."""
    double: bool = True
    """Double DQN: the online network picks the bootstrap action, the target scores it."""
    priority_epsilon: float = 1e-6
    """Added to |TD error| so that no transition's priority is 0."""

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError("'learner.dqn.learning_rate' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.dqn.gamma' must be in (0, 1]")
        if self.n_step < 1:
            raise ConfigError("'learner.dqn.n_step' must be at least 1")
        if self.target_update_period < 1:
            raise ConfigError("'learner.dqn.target_update_period' must be at least 1")
        if self.huber_delta <= 0:
            raise ConfigError("'learner.dqn.huber_delta' must be positive")
        if self.max_grad_norm <= 0:
            raise ConfigError("'learner.dqn.max_grad_norm' must be positive")
        if self.priority_epsilon <= 0:
            raise ConfigError("'learner.dqn.priority_epsilon' must be positive")


def check(config: DQNConfig, sizes: Sizes) -> None:
    """A window never spans chunks: n may not exceed the chunk length."""
    if config.n_step > sizes.trajectory_length:
        raise ConfigError(f"'learner.dqn.n_step' ({config.n_step}) must not exceed "
                          f"'actors.trajectory_length' ({sizes.trajectory_length}): a window "
                          "ends with its chunk")


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


def init_target(params: Any) -> Any:
    """The target network starts as a copy of the online one."""
    return {"target": params}


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
        updates, opt_state = optimizer.update(grads, state.opt_state, params["net"])
        learning_rate = with_live(config, state.hyper).learning_rate
        params = {**params, "net": descend(params["net"], updates, learning_rate)}
        version = state.version + 1
        copy = version % config.target_update_period == 0
        new_target = jax.tree.map(lambda online, old: jnp.where(copy, online, old),
                                  params, state.extra["target"])
        metrics = {"loss": loss, "q_mean": q.mean(), "td_error_abs": jnp.abs(errors).mean(),
                   "grad_norm": optax.tree.norm(grads),
                   "priorities": jnp.abs(errors) + config.priority_epsilon}
        return state._replace(params=params, opt_state=opt_state, version=version,
                              extra={"target": new_target}), metrics

    return update


ALGORITHM = Algorithm(
    name="dqn", config=DQNConfig, make_optimizer=make_optimizer, make_update=make_update,
    fields=("obs", "actions", "rewards", "steps", "terminated", "truncated", "trunc_values",
            "next_obs", "weights"),
    source="replay", check=check, heads=("dueling", "q"), init_extra=init_target,
    replay_window=lambda config: config.n_step, live=("learning_rate",))
