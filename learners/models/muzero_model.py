"""MuZero's learned model (flax linen): representation, dynamics and prediction.

The representation maps an observation to a latent state of `latent` units, scaled to
[0, 1] per row (min-max, as MuZero scales its hidden states, so that the dynamics sees
one range however deep the unroll goes). The dynamics maps a latent state and an action
(one-hot) to the next latent state and the reward's logits over the support; the
prediction maps a latent state to policy logits and the value's logits. `torso` 'mlp'
reads flat observations through MLPs; 'nature_cnn' reads frames through the Nature-CNN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from learners.models.torsos import MLP, nature_torso
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.dataflow.env_spec import EnvSpec


def scale_latent(latent: jax.Array) -> jax.Array:
    """Each row min-max scaled to [0, 1]."""
    low = latent.min(-1, keepdims=True)
    high = latent.max(-1, keepdims=True)
    return (latent - low) / jnp.maximum(high - low, 1e-5)


class FrameEncoder(nn.Module):
    """The Nature-CNN torso, then a dense layer to the latent width."""

    latent: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return nn.Dense(self.latent)(nature_torso(obs))


class MuZeroModel(nn.Module):
    """h (observation -> latent), g (latent, action -> latent, reward logits) and
    f (latent -> policy logits, value logits), on a support of `2 support_size + 1`."""

    action_dim: int
    hidden: Sequence[int] = (64, 64)
    latent: int = 64
    support_size: int = 10
    torso: str = "mlp"
    activation: str = "relu"
    rescaling_epsilon: float = 1e-3
    """The epsilon of h, under which the supports hold values and rewards."""

    def setup(self) -> None:
        width = 2 * self.support_size + 1
        self.represent_mlp = MLP(self.hidden, self.latent, 1.0, self.activation)
        self.dynamics_mlp = MLP(self.hidden, self.latent, 1.0, self.activation)
        self.reward_mlp = MLP(self.hidden, width, 0.0, self.activation)
        self.policy_mlp = MLP(self.hidden, self.action_dim, 0.01, self.activation)
        self.value_mlp = MLP(self.hidden, width, 0.0, self.activation)
        if self.torso == "nature_cnn":
            self.frames = FrameEncoder(self.latent)

    def represent(self, obs: jax.Array) -> jax.Array:
        if self.torso == "nature_cnn":
            return scale_latent(self.frames(obs))
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        return scale_latent(self.represent_mlp(x))

    def predict(self, latent: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.policy_mlp(latent), self.value_mlp(latent)

    def dynamics(self, latent: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jnp.concatenate([latent, jax.nn.one_hot(action, self.action_dim)], -1)
        return scale_latent(self.dynamics_mlp(x)), self.reward_mlp(x)

    def initial(self, obs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(latent, policy logits, value logits) of observations [N, ...]."""
        latent = self.represent(obs)
        return (latent, *self.predict(latent))

    def recurrent(self, latent: jax.Array,
                  action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(next latent, reward logits, policy logits, value logits) of a step."""
        latent, reward = self.dynamics(latent, action)
        return (latent, reward, *self.predict(latent))

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Every part once (for `init`): the first step's policy and value logits."""
        latent, _, _ = self.initial(obs)
        _, _, policy, value = self.recurrent(latent, jnp.zeros(obs.shape[0], jnp.int32))
        return policy, value


class LogitFns(NamedTuple):
    """A model as functions of its parameters, its heads' logits as they are (the loss
    reads them so; the search turns the supports into scalars first)."""

    initial: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]
    """(params, obs [B, ...]) -> (latent, policy logits [B, A], value logits [B, W])."""
    recurrent: Callable[[Any, jax.Array, jax.Array],
                        tuple[jax.Array, jax.Array, jax.Array, jax.Array]]
    """(params, latent, action [B]) -> (latent, reward logits, policy logits, value logits)."""


def logit_fns(model: MuZeroModel) -> LogitFns:
    """`model`'s initial and recurrent steps as `LogitFns`."""

    def initial(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        # flax types apply() as its mutable form's (output, variables) or an output
        return model.apply(params, obs, method=MuZeroModel.initial)  # type: ignore[return-value]

    def recurrent(params: Any, latent: jax.Array, action: jax.Array) -> tuple:
        return model.apply(params, latent, action, method=MuZeroModel.recurrent)

    return LogitFns(initial, recurrent)


def muzero_model(config: ExperimentConfig, spec: EnvSpec) -> MuZeroModel:
    """The model `network.head` muzero names: `network.kind` picks its torso, `hidden` and
    `activation` its MLPs, `learner.muzero` its latent width, support and h."""
    settings = algorithm_config(config)
    return MuZeroModel(spec.action_dim, tuple(config.network.hidden), settings.latent,
                       settings.support_size, "nature_cnn" if config.network.kind ==
                       "nature_cnn" else "mlp", config.network.activation,
                       settings.rescaling_epsilon)
