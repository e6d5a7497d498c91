"""A plugin algorithm that brings its own network: SAC (Haarnoja et al. 2018), in this file only.

Everything it needs is here, and nothing in the package is edited: its config (the
`learner.sac` section), its network (a tanh-squashed Gaussian actor beside twin
critics of state and action, and the distribution that reads the actor), declared as
`network.head` 'sac' with its own action-space rule (continuous actions only), its
replay (n-step transitions, plus the acting policy's `logp` of each step, a chunk field
no built-in replay keeps), its optimizer and its pure update, and one `register(...)`.
An experiment names this module in `plugins`, so the launcher and every worker import
it before the config is checked. Its entropy temperature is fixed, to stay short.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from learners.algorithms.dqn import nstep_targets
from learners.algorithms.prepare import scale_rewards
from learners.algorithms.train_state import TrainState
from learners.models.distributions import Distribution
from learners.models.networks import Policy, as_policy
from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import Algorithm, Network, Replay, Sizes, register
from srl_jax.dataflow.env_spec import EnvSpec

LOG_STD = (-5.0, 2.0)
"""The actor's log-std is squashed into this range."""


@dataclass
class SACConfig:
    """SAC hyperparameters: the `learner.sac` section of the experiment config."""

    learning_rate: float = 3e-4
    """Adam step size of the actor and the critics."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Steps of each sampled window: the n of the n-step target."""
    tau: float = 0.005
    """Polyak step of the target critics towards the online ones, per update."""
    alpha: float = 0.2
    """Entropy temperature (fixed)."""
    priority_epsilon: float = 1e-6
    """Added to |TD error| so that no transition's priority is 0."""

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError("'learner.sac.learning_rate' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.sac.gamma' must be in (0, 1]")
        if self.n_step < 1:
            raise ConfigError("'learner.sac.n_step' must be at least 1")
        if not 0 < self.tau <= 1:
            raise ConfigError("'learner.sac.tau' must be in (0, 1]")


class SACNetwork(nn.Module):
    """(obs) -> (actor output: means and log-stds [N, 2A] of the Gaussian before the
    squash, value [N]: the smaller critic's value of the actor's mode); `q` gives both
    critics' values of (obs, squashed actions in [-1, 1]) [2, N]."""

    action_dim: int
    hidden: tuple[int, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    @property
    def box(self) -> tuple[jax.Array, jax.Array]:
        """The action box's center and half widths: action = center + half * squashed."""
        low, high = jnp.asarray(self.low), jnp.asarray(self.high)
        return (high + low) / 2, (high - low) / 2

    def setup(self) -> None:
        self.actor = [nn.Dense(h) for h in self.hidden] + [nn.Dense(2 * self.action_dim)]
        self.critics = [[nn.Dense(h) for h in self.hidden] + [nn.Dense(1)] for _ in range(2)]

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = obs.reshape(obs.shape[0], -1)
        for layer in self.actor[:-1]:
            x = nn.relu(layer(x))
        mean, log_std = jnp.split(self.actor[-1](x), 2, -1)
        out = jnp.concatenate([mean, jnp.clip(log_std, *LOG_STD)], -1)
        return out, self.q(obs, jnp.tanh(mean)).min(0)

    def q(self, obs: jax.Array, squashed: jax.Array) -> jax.Array:
        values = []
        for critic in self.critics:
            x = jnp.concatenate([obs.reshape(obs.shape[0], -1), squashed], -1)
            for layer in critic[:-1]:
                x = nn.relu(layer(x))
            values.append(critic[-1](x)[:, 0])
        return jnp.stack(values)


def squashed_log_prob(out: jax.Array, u: jax.Array, half: jax.Array) -> jax.Array:
    """Log-density of the action center + half * tanh(u), u drawn from the Gaussian `out`."""
    mean, log_std = jnp.split(out, 2, -1)
    z = (u - mean) * jnp.exp(-log_std)
    gaussian = -0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)
    return jnp.sum(gaussian - jnp.log(1 - jnp.tanh(u) ** 2 + 1e-6) - jnp.log(half), -1)


def squashed_gaussian(center: jax.Array, half: jax.Array) -> Distribution:
    """The actor's distribution: a Gaussian squashed by tanh, scaled to the action box."""

    def sample(key: jax.Array, out: jax.Array) -> jax.Array:
        mean, log_std = jnp.split(out, 2, -1)
        return center + half * jnp.tanh(mean + jnp.exp(log_std) * jax.random.normal(
            key, mean.shape))

    def log_prob(out: jax.Array, actions: jax.Array) -> jax.Array:
        squashed = jnp.clip((actions - center) / half, -1 + 1e-6, 1 - 1e-6)
        return squashed_log_prob(out, jnp.arctanh(squashed), half)

    def entropy(out: jax.Array) -> jax.Array:  # the Gaussian's, before the squash
        return jnp.sum(jnp.split(out, 2, -1)[1] + 0.5 * (1 + math.log(2 * math.pi)), -1)

    def mode(out: jax.Array) -> jax.Array:
        return center + half * jnp.tanh(jnp.split(out, 2, -1)[0])

    return Distribution(sample, log_prob, entropy, mode)


def build_network(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    """The `sac` network of `network.hidden` for `spec`'s action box."""
    module = SACNetwork(spec.action_dim, tuple(config.network.hidden), spec.action_low,
                        spec.action_high)
    return as_policy(config, spec, module, squashed_gaussian(*module.box)), module


def check_network(config: ExperimentConfig) -> None:
    """Its MLPs read vectors as they are (its update keeps no observation statistics)."""
    if config.network.kind != "mlp" or config.network.core != "none":
        raise ConfigError("'network.head': 'sac' is MLPs without a core: 'network.kind' mlp, "
                          "'network.core' none")
    if config.learner.normalize_obs:
        raise ConfigError("'learner.normalize_obs': 'sac' reads observations as they are")


NETWORK = Network(head="sac", build=build_network, actions=("continuous",), check=check_network)


def make_optimizer(config: SACConfig, sizes: Sizes) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate)


def init_target(params: Any, config: SACConfig) -> Any:
    """The target critics start as copies of the online ones (with the actor, unused)."""
    return {"target": params["net"]}


def make_update(policy: Policy, optimizer: optax.GradientTransformation, config: SACConfig,
                sizes: Sizes) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """One step of the critics on n-step soft targets and of the actor on the critics'
    value minus the temperature times its log-probability, together; the target critics
    follow by Polyak averaging. Metrics include the rows' new `priorities`, and
    `logp_drift`: the acting policy's log-probability of the replayed actions (the `logp`
    its replay keeps) less the current policy's, how far the policy moved since."""
    module, dist = policy.network, policy.dist
    center, half = module.box

    def q(net: Any, obs: jax.Array, squashed: jax.Array) -> jax.Array:
        return module.apply(net, obs, squashed, method=SACNetwork.q)

    def sampled(net: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Reparameterized squashed actions at `obs` and their log-probabilities."""
        out, _ = module.apply(net, obs)
        mean, log_std = jnp.split(out, 2, -1)
        u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        return jnp.tanh(u), squashed_log_prob(out, u, half)

    def loss_fn(net: Any, target: Any, batch: dict, key: jax.Array) -> tuple:
        now, later = jax.random.split(key)
        next_actions, next_logp = sampled(net, batch["next_obs"], later)
        next_values = q(target, batch["next_obs"], next_actions).min(0) \
            - config.alpha * next_logp
        rewards = scale_rewards(batch["rewards"], sizes.reward_scale, sizes.reward_clip)
        targets = jax.lax.stop_gradient(nstep_targets(
            rewards, batch["steps"], batch["terminated"], batch["truncated"],
            batch["trunc_values"], next_values, config.gamma))
        values = q(net, batch["obs"], jnp.clip((batch["actions"] - center) / half, -1, 1))
        weights = batch["weights"] / jnp.max(batch["weights"])
        critic_loss = jnp.mean(weights * jnp.sum(jnp.square(targets - values), 0))
        actions, logp = sampled(net, batch["obs"], now)
        actor_loss = jnp.mean(config.alpha * logp
                              - q(jax.lax.stop_gradient(net), batch["obs"], actions).min(0))
        out, _ = module.apply(net, batch["obs"])
        drift = jnp.mean(batch["logp"] - dist.log_prob(out, batch["actions"]))
        errors = targets - values.min(0)
        return critic_loss + actor_loss, {
            "loss": critic_loss + actor_loss, "critic_loss": critic_loss,
            "actor_loss": actor_loss, "q_mean": values.mean(), "entropy": -logp.mean(),
            "logp_drift": drift, "priorities": jnp.abs(errors) + config.priority_epsilon}

    def update(state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        key, step = jax.random.split(state.key)
        net, target = state.params["net"], state.extra["target"]
        grads, metrics = jax.grad(loss_fn, has_aux=True)(net, target, batch, step)
        updates, opt_state = optimizer.update(grads, state.opt_state, net)
        new = optax.apply_updates(net, updates)
        target = optax.incremental_update(new, target, config.tau)
        metrics["param_change"] = optax.tree.norm(jax.tree.map(jnp.subtract, new, net))
        return state._replace(params={**state.params, "net": new}, opt_state=opt_state,
                              key=key, version=state.version + 1,
                              extra={"target": target}), metrics

    return update


ALGORITHM = Algorithm(
    name="sac", config=SACConfig, make_optimizer=make_optimizer, make_update=make_update,
    fields=("obs", "actions", "rewards", "steps", "terminated", "truncated", "trunc_values",
            "next_obs", "weights", "logp"),
    networks=(NETWORK,), replay=Replay(window=lambda config: config.n_step, fields=("logp",)),
    init_extra=init_target)
register(ALGORITHM)
