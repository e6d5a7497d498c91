"""Networks (flax linen): the actor-critic MLP and its construction from the config."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from srl_jax.config import NetworkConfig

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


class MLP(nn.Module):
    """Hidden layers with orthogonal init (scale sqrt 2), then a linear head."""

    hidden: Sequence[int]
    outputs: int
    head_scale: float
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.outputs, kernel_init=nn.initializers.orthogonal(self.head_scale))(x)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs, as in cleanrl's PPO: (logits, value)."""

    num_actions: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        logits = MLP(self.hidden, self.num_actions, 0.01, self.activation, name="actor")(x)
        value = MLP(self.hidden, 1, 1.0, self.activation, name="critic")(x)
        return logits, value[:, 0]


def make_network(config: NetworkConfig, num_actions: int) -> ActorCritic:
    return ActorCritic(num_actions, tuple(config.hidden), config.activation)


def init_params(network: ActorCritic, obs_shape: tuple[int, ...], seed: int) -> dict:
    """Parameters from the seed alone, so every worker can build version 0 itself."""
    return network.init(jax.random.key(seed), jnp.zeros((1, *obs_shape), jnp.float32))
