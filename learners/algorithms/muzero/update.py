"""MuZero's update on replayed positions (Schrittwieser et al. 2020; MuZero Reanalyze,
Schrittwieser et al. 2021): each sampled row is a position with the window of steps after
it (replay/position_buffer.py); the position starts a K-step unroll
(`targets.unroll_targets`) whose n-step value targets bootstrap from the target network's
value of the observation that ends each window (at a time-limit cut, of its final
observation where the replay keeps it), the loss is `loss.unrolled_loss` weighted
by the row's importance weight, and the row's new priority is |predicted value - value
target| of the position. Rewards are scaled and clipped (`learner.reward_scale`,
`reward_clip`) before they enter the targets, as the reward head learns them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.dqn import q_learning_step
from learners.algorithms.muzero.loss import unrolled_loss
from learners.algorithms.muzero.targets import unroll_targets
from learners.algorithms.muzero_config import MuZeroConfig
from learners.algorithms.prepare import scale_rewards
from learners.algorithms.sequences import REPLAYED_PER_SEQUENCE, time_major
from learners.algorithms.train_state import TrainState
from learners.models.muzero_model import logit_fns
from learners.models.networks import Policy
from learners.models.support import from_support
from srl_jax.dataflow.algorithms import Sizes


def make_optimizer(config: MuZeroConfig, sizes: Sizes) -> optax.GradientTransformation:
    """Adam's direction of the clipped gradient plus L2 (`weight_decay` times the
    parameters, added before Adam as an L2 term of the loss would be), without the step
    size, which the update applies from `TrainState.hyper`."""
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.add_decayed_weights(config.weight_decay),
                       optax.scale_by_adam(eps=config.adam_eps))


def make_update(policy: Policy, optimizer: optax.GradientTransformation,
                config: MuZeroConfig, sizes: Sizes) -> Any:
    """Pure (TrainState, batch of positions) -> (TrainState, metrics) for the MuZero model
    `policy.network`; the batch's fields are [B, ...] (the replay's rows, each a window of
    K + n steps), its metrics include the rows' `priorities` [B]. The step size is read
    from `state.hyper`; the target network (`state.extra["target"]`) is copied from the
    online one every `target_update_period` updates."""
    fns = logit_fns(policy.network)

    def target_values(target: Any, obs: jax.Array) -> jax.Array:
        """The target network's value [steps, B] of observations [steps, B, ...]."""
        steps, B = obs.shape[:2]
        _, _, value = fns.initial(target["net"], obs.reshape(steps * B, *obs.shape[2:]))
        values = from_support(value, config.support_size, config.rescaling_epsilon)
        return jax.lax.stop_gradient(values.reshape(steps, B))

    def update(state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        seqs = time_major(batch, REPLAYED_PER_SEQUENCE)
        seqs["weights"] = seqs["weights"] / jnp.max(seqs["weights"])
        seqs["rewards"] = scale_rewards(seqs["rewards"], sizes.reward_scale, sizes.reward_clip)
        target = state.extra["target"]
        seqs["values"] = target_values(target, seqs["obs"])
        if seqs["final_obs"].size:  # time-limit cuts: the target network's value of their
            cut = seqs["truncated"] > 0  # final observation, not the acting search's
            seqs["trunc_values"] = jnp.where(cut, target_values(target, seqs["final_obs"]),
                                             seqs["trunc_values"])
        obs, targets = unroll_targets(seqs, config.unroll_steps, config.n_step, config.gamma,
                                      starts=1)

        def loss(net: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
            return unrolled_loss(fns, net, obs, targets, config.support_size,
                                 config.rescaling_epsilon, config.value_coef)

        (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state.params["net"])
        metrics["priorities"] = metrics["priorities"] + config.priority_epsilon
        metrics["bootstrap_mean"] = seqs["values"].mean()
        return q_learning_step(state, state.params, grads, optimizer, config, metrics)

    return update
