"""Networks (flax linen): the actor-critic MLP, and the policy the workers share.

A policy's parameters are one pytree: the network's weights under "net" and
the running observation statistics under "obs_mean", "obs_var", "obs_count".
They travel together to the inference servers (and into checkpoints), so the
servers normalize observations exactly as the learner does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from learners.distributions import Distribution, distribution
from srl_jax.config import ExperimentConfig
from srl_jax.env_spec import EnvSpec, check_network

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}
OBS_CLIP = 10.0


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
    """Separate policy and value MLPs, as in cleanrl's PPO: (policy output, value).

    The policy output is logits for discrete actions, or means and a
    state-independent log-std side by side for continuous ones.
    """

    action_dim: int
    continuous: bool = False
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        out = MLP(self.hidden, self.action_dim, 0.01, self.activation, name="actor")(x)
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            out = jnp.concatenate([out, jnp.broadcast_to(log_std, out.shape)], -1)
        value = MLP(self.hidden, 1, 1.0, self.activation, name="critic")(x)
        return out, value[:, 0]


class NatureCNN(nn.Module):
    """The Nature-DQN torso (Mnih et al. 2015) shared by policy and value, as in
    cleanrl's PPO-Atari: conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, dense 512.

    Takes uint8 frames [N, H, W, C] and scales them to [0, 1] itself.
    """

    action_dim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        init = nn.initializers.orthogonal(np.sqrt(2))
        x = obs.astype(jnp.float32) * (1.0 / 255.0)
        x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID", kernel_init=init)(x))
        x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID", kernel_init=init)(x))
        x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID", kernel_init=init)(x))
        x = nn.relu(nn.Dense(512, kernel_init=init)(x.reshape(x.shape[0], -1)))
        logits = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01))(x)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(x)
        return logits, value[:, 0]


class Policy(NamedTuple):
    """What algorithms and acting need: apply (with normalization) and the distribution."""

    apply: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]
    dist: Distribution
    normalize_obs: bool


def make_network(config: ExperimentConfig, spec: EnvSpec) -> nn.Module:
    """The network `network.kind` names; ConfigError if it cannot take these spaces."""
    check_network(config.network.kind, spec, config.env.id)
    if config.network.kind == "nature_cnn":
        return NatureCNN(spec.action_dim)
    return ActorCritic(spec.action_dim, spec.continuous, tuple(config.network.hidden),
                       config.network.activation)


def make_policy(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    network = make_network(config, spec)
    normalize = config.learner.normalize_obs

    def apply(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = obs.astype(jnp.float32)
        if normalize:
            x = jnp.clip((x - params["obs_mean"]) * jax.lax.rsqrt(params["obs_var"] + 1e-8),
                         -OBS_CLIP, OBS_CLIP)
        return network.apply(params["net"], x)

    return Policy(apply, distribution(spec.continuous), normalize), network


def init_policy_params(network: nn.Module, obs_shape: tuple[int, ...], seed: int) -> dict:
    """Parameters from the seed alone, so every worker can build version 0 itself."""
    net = network.init(jax.random.key(seed), jnp.zeros((1, *obs_shape), jnp.float32))
    return {"net": net, "obs_mean": jnp.zeros(obs_shape, jnp.float32),
            "obs_var": jnp.ones(obs_shape, jnp.float32),
            "obs_count": jnp.zeros((), jnp.float32)}


def update_obs_stats(params: dict, obs: jax.Array) -> dict:
    """Merge a batch's observation moments into the running ones (Chan et al.)."""
    x = obs.reshape(-1, *params["obs_mean"].shape).astype(jnp.float32)
    count = jnp.asarray(x.shape[0], jnp.float32)
    mean, var = x.mean(0), x.var(0)
    total = params["obs_count"] + count
    delta = mean - params["obs_mean"]
    new_mean = params["obs_mean"] + delta * count / total
    m2 = (params["obs_var"] * params["obs_count"] + var * count
          + jnp.square(delta) * params["obs_count"] * count / total)
    return {**params, "obs_mean": new_mean, "obs_var": m2 / total, "obs_count": total}
