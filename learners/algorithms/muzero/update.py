"""MuZero's update on replayed sequences: every step of every sequence starts a K-step
unroll (`targets.unroll_targets`), the loss is `loss.unrolled_loss` weighted by each
sequence's importance weight, and each sequence's new priority mixes its steps' value
errors as R2D2 mixes TD errors."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.muzero.loss import unrolled_loss
from learners.algorithms.muzero.targets import unroll_targets
from learners.algorithms.muzero_config import MuZeroConfig
from learners.algorithms.r2d2 import sequence_priorities
from learners.algorithms.sequences import REPLAYED_PER_SEQUENCE, time_major
from learners.algorithms.train_state import TrainState, descend
from learners.models.muzero_model import logit_fns
from learners.models.networks import Policy
from srl_jax.dataflow.algorithms import Sizes, with_live


def make_update(policy: Policy, optimizer: optax.GradientTransformation,
                config: MuZeroConfig, sizes: Sizes) -> Any:
    """Pure (TrainState, batch of sequences) -> (TrainState, metrics) for the MuZero model
    `policy.network`; the batch's fields are [B, ...] (the replay's rows), its metrics
    include the sequences' `priorities` [B]. The step size is read from `state.hyper`
    where it has it."""
    fns = logit_fns(policy.network)

    def update(state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        seqs = time_major(batch, REPLAYED_PER_SEQUENCE)
        seqs["weights"] = seqs["weights"] / jnp.max(seqs["weights"])
        obs, targets = unroll_targets(seqs, config.unroll_steps, config.n_step, config.gamma)

        def loss(net: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
            return unrolled_loss(fns, net, obs, targets, config.support_size,
                                 config.rescaling_epsilon, config.value_coef)

        (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state.params["net"])
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params["net"])
        learning_rate = with_live(config, state.hyper).learning_rate
        params = {**state.params, "net": descend(state.params["net"], updates, learning_rate)}
        T, B = seqs["actions"].shape
        errors = metrics.pop("priorities").reshape(T, B)
        metrics["priorities"] = sequence_priorities(errors, config.priority_eta,
                                                    config.priority_epsilon)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return (state._replace(params=params, opt_state=opt_state, version=state.version + 1),
                metrics)

    return update
