"""QMIX's networks (Rashid et al. 2018): per-agent recurrent Q networks and the monotonic
mixer that sums them into the team's Q, conditioned on the global state.

The agents act on their own Q-values (greedily, among their legal actions), so the
inference servers run the agent network only. The mixer trains beside it: its
weights are made by hypernetworks from the global state and kept non-negative (their
absolute values), so Q_tot rises with every agent's Q and the agents' greedy actions
are the team's (the individual-global-max property QMIX rests on). Both live in one
flax module, so their parameters are one tree that one optimizer steps and one
checkpoint keeps; the servers receive the mixer's few weights with the agents'.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from learners.models.conv import conv_impl
from learners.models.distributions import GREEDY
from learners.models.networks import Policy, RecurrentActorCritic, as_policy
from learners.models.orthogonal import orthogonal
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.dataflow.env_spec import EnvSpec, core_state_size


class MonotonicMixer(nn.Module):
    """(agent Qs [N, n], global state [N, G]) -> Q_tot [N]: a hidden layer of `embed`
    ELUs and a linear output whose weights are |hypernetwork(state)|, and biases
    that are any function of the state (QMIX's two-layer hypernetworks). Every layer
    that makes a weight, a bias or the state's value V(s) starts at orthogonal weights of
    `init_scale`: small, Q_tot starts near 0. At unit scale the weights multiply every
    agent's overestimate into Q_tot and its bootstrapped targets diverge, and V(s) of a
    raw global state (SMAX's positions reach 35) starts at values of several units, which
    bootstrapping then carries from target to target for thousands of updates."""

    agents: int
    embed: int = 32
    hyper_hidden: int = 64
    init_scale: float = 1.0

    @nn.compact
    def __call__(self, q: jax.Array, state: jax.Array) -> jax.Array:
        n, e = self.agents, self.embed

        def small(width: int, name: str) -> nn.Dense:
            return nn.Dense(width, kernel_init=orthogonal(self.init_scale), name=name)

        def hyper(width: int, name: str) -> jax.Array:
            h = nn.relu(nn.Dense(self.hyper_hidden, name=f"{name}_hidden")(state))
            return small(width, name)(h)

        w1 = jnp.abs(hyper(n * e, "w1")).reshape(-1, n, e)
        b1 = small(e, "b1")(state)
        hidden = nn.elu(jnp.einsum("bn,bne->be", q, w1) + b1)
        w2 = jnp.abs(hyper(e, "w2"))
        v = small(1, "v")(nn.relu(nn.Dense(e, name="v_hidden")(state)))[:, 0]
        return jnp.sum(hidden * w2, -1) + v


class QMixNetwork(nn.Module):
    """Each agent's recurrent Q network (`RecurrentActorCritic` with a Q head), which
    `__call__` runs as any recurrent network, and the team's mixer (`mix`), which only
    the learner calls; initialising the module makes both."""

    action_dim: int
    torso: str
    hidden: Sequence[int]
    activation: str
    core: str
    size: int
    agents: int
    state_width: int
    embed: int
    hyper_hidden: int
    init_scale: float
    conv: str = "xla"
    frame_shape: tuple[int, ...] = ()

    def setup(self) -> None:
        self.q = RecurrentActorCritic(self.action_dim, False, self.torso, tuple(self.hidden),
                                      self.activation, self.core, self.size, self.conv,
                                      self.frame_shape, "q")
        self.mixer = MonotonicMixer(self.agents, self.embed, self.hyper_hidden,
                                    self.init_scale)

    @property
    def state_size(self) -> int:
        return core_state_size(self.core, self.size)

    def __call__(self, obs: jax.Array, state: jax.Array,
                 resets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        if self.is_initializing():  # the mixer's parameters, made with the agents'
            self.mix(jnp.zeros((1, self.agents)), jnp.zeros((1, self.state_width)))
        return self.q(obs, state, resets)

    def mix(self, q: jax.Array, state: jax.Array) -> jax.Array:
        """Q_tot [N] of the agents' chosen Qs [N, n] in global states [N, G]."""
        return self.mixer(q, state)


def qmix_network(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    """The `qmix` network: the agents' recurrent Q network on the MLP or Nature-CNN torso,
    acting greedily, and the mixer over `spec.agents` agents and the global state."""
    network, mixing = config.network, algorithm_config(config)  # learner.qmix sizes the mixer
    module = QMixNetwork(spec.action_dim, network.kind, tuple(network.hidden),
                         network.activation, network.core, network.core_size, spec.agents,
                         spec.global_state_size, mixing.mixer_embed, mixing.hyper_hidden,
                         mixing.mixer_init_scale, conv_impl(network.conv), spec.frame_shape)
    return as_policy(config, spec, module, GREEDY), module
