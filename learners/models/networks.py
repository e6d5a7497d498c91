"""Networks (flax linen): the actor-critic MLP, the Nature-CNN, their recurrent
versions, the Q-network of value-based algorithms, MuZero's model as a policy
(`muzero_policy`), and the policy the workers share. Their torsos are in
`learners/models/torsos.py`. Each network is built by the builder its algorithm declares
(`srl_jax.dataflow.algorithms.Network`: `actor_critic_network`, `q_network`,
`muzero_network` here, a plugin's in its own module); `make_policy` calls the run's.

A policy's parameters are one pytree: the network's weights under "net" and
the running observation statistics under "obs_mean", "obs_var", "obs_count".
They travel together to the inference servers (and into checkpoints), so the
servers normalize observations exactly as the learner does.

A policy with a recurrent core (`network.core`) maps (observation, state) to
(distribution, value, new state). Its state is one float32 vector per column
(an LSTM's cell and hidden vectors side by side, a GRU's hidden vector), so it
travels in requests and chunks as one [N, S] array; zeros start an episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from learners.models.conv import conv_impl
from learners.models.distributions import GREEDY, Distribution, distribution
from learners.models.muzero_model import MuZeroModel, muzero_model
from learners.models.orthogonal import orthogonal
from learners.models.support import from_support
from learners.models.torsos import MLP, mlp_torso, nature_torso
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import check_spaces, network_of
from srl_jax.dataflow.env_spec import EnvSpec, check_network, core_state_size

OBS_CLIP = 10.0


def with_log_std(module: nn.Module, means: jax.Array) -> jax.Array:
    """Gaussian means and the module's state-independent log-std ("log_std"), side by side."""
    log_std = module.param("log_std", nn.initializers.zeros, (means.shape[-1],))
    return jnp.concatenate([means, jnp.broadcast_to(log_std, means.shape)], -1)


def heads(module: nn.Module, x: jax.Array, action_dim: int,
          continuous: bool) -> tuple[jax.Array, jax.Array]:
    """Linear policy output (orthogonal 0.01) and value (orthogonal 1) on shared features;
    continuous actions add a state-independent log-std, as `ActorCritic` does."""
    out = nn.Dense(action_dim, kernel_init=orthogonal(0.01), name="policy_head")(x)
    if continuous:
        out = with_log_std(module, out)
    value = nn.Dense(1, kernel_init=orthogonal(1.0), name="value_head")(x)
    return out, value[:, 0]


def q_heads(x: jax.Array, action_dim: int, dueling: bool) -> tuple[jax.Array, jax.Array]:
    """(Q-values [N, A], max_a Q [N]) on features `x`; `dueling` splits the head into a
    state value and advantages recombined as V + A - mean(A) (Wang et al. 2016)."""
    advantages = nn.Dense(action_dim, name="q_head")(x)
    if dueling:
        value = nn.Dense(1, name="value_head")(x)
        q = value + advantages - advantages.mean(-1, keepdims=True)
    else:
        q = advantages
    return q, q.max(-1)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs, as in cleanrl's PPO: (policy output, value).

    The policy output is logits for discrete actions, or means and a
    state-independent log-std side by side for continuous ones. With
    `critic_width` (a centralized critic, MAPPO's) the value MLP reads `critic_in`
    [N, critic_width] instead of the observation; acting passes none and gets zero
    values, which the learner replaces with the critic's. `layer_norm`: both MLPs
    normalize their inputs and hidden layers (`network.layer_norm`).
    """

    action_dim: int
    continuous: bool = False
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    critic_width: int = 0
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array,
                 critic_in: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        out = MLP(self.hidden, self.action_dim, 0.01, self.activation, self.layer_norm,
                  name="actor")(x)
        if self.continuous:
            out = with_log_std(self, out)
        critic_x = critic_in if self.critic_width else x
        if critic_x is None:  # a centralized critic given no global state: no value
            return out, jnp.zeros(x.shape[0], jnp.float32)
        value = MLP(self.hidden, 1, 1.0, self.activation, self.layer_norm, name="critic")(
            critic_x.astype(jnp.float32))
        return out, value[:, 0]


class NatureCNN(nn.Module):
    """The Nature-DQN torso (Mnih et al. 2015) shared by policy and value, as in
    cleanrl's PPO-Atari: conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, dense 512.

    Takes uint8 frames [N, H, W, C] and scales them to [0, 1] itself.
    """

    action_dim: int
    conv: str = "xla"
    frame_shape: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nature_torso(obs, self.conv, self.frame_shape)
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01))(x)
        value = nn.Dense(1, kernel_init=orthogonal(1.0))(x)
        return logits, value[:, 0]


class QNetwork(nn.Module):
    """Action values on the MLP or Nature-CNN torso: (Q-values [N, A], max_a Q [N])
    (`q_heads`). The max is the policy's value: the inference server reports it, and
    actors store it as the bootstrap of a time-limit cut.
    """

    action_dim: int
    kind: str = "mlp"
    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"
    dueling: bool = True
    conv: str = "xla"
    frame_shape: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        if self.kind == "nature_cnn":
            x = nature_torso(obs, self.conv, self.frame_shape)
        else:
            x = mlp_torso(obs.reshape(obs.shape[0], -1).astype(jnp.float32), self.hidden,
                          self.activation)
        return q_heads(x, self.action_dim, self.dueling)


class ResettingCell(nn.Module):
    """One step of the recurrent core; a column whose episode starts at this step
    (`reset`) begins from a zero state."""

    kind: str
    size: int

    @nn.compact
    def __call__(self, carry: Any, inputs: tuple[jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
        x, reset = inputs
        carry = jax.tree.map(lambda c: jnp.where(reset[:, None], 0.0, c), carry)
        if self.kind == "lstm":
            return nn.OptimizedLSTMCell(self.size, recurrent_kernel_init=orthogonal(),
                                        name="lstm")(carry, x)
        return nn.GRUCell(self.size, recurrent_kernel_init=orthogonal(), name="gru")(carry, x)


class RecurrentActorCritic(nn.Module):
    """Torso (the MLP's hidden layers or the Nature-CNN's), an LSTM or GRU core, and
    linear policy and value heads (or, with `head` q or dueling, R2D2's Q-value heads:
    `q_heads`), over [T, B] sequences: (obs [T, B, ...], state [B, S], resets [T, B])
    -> (policy output [T, B, A], value [T, B], state [B, S]).

    The torso and the heads run on all T * B rows at once; only the core steps
    through time. Acting is the case T = 1.
    """

    action_dim: int
    continuous: bool
    torso: str
    hidden: Sequence[int]
    activation: str
    core: str
    size: int
    conv: str = "xla"
    frame_shape: tuple[int, ...] = ()
    head: str = "actor_critic"

    @property
    def state_size(self) -> int:
        return core_state_size(self.core, self.size)

    def unpack(self, state: jax.Array) -> Any:
        """[B, S] -> the cell's carry: (c, h) for an LSTM, h for a GRU."""
        if self.core == "lstm":
            return state[:, :self.size], state[:, self.size:]
        return state

    def pack(self, carry: Any) -> jax.Array:
        return jnp.concatenate(carry, -1) if self.core == "lstm" else carry

    @nn.compact
    def __call__(self, obs: jax.Array, state: jax.Array,
                 resets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        T, B = resets.shape
        rows = obs.reshape(T * B, *obs.shape[2:])
        if self.torso == "nature_cnn":
            x = nature_torso(rows, self.conv, self.frame_shape)
        else:
            x = mlp_torso(rows.reshape(T * B, -1).astype(jnp.float32), self.hidden,
                          self.activation)
        core = nn.scan(ResettingCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=0, out_axes=0)(self.core, self.size, name="core")
        carry, h = core(self.unpack(state), (x.reshape(T, B, -1), resets))
        features = h.reshape(T * B, self.size)
        if self.head == "actor_critic":
            out, value = heads(self, features, self.action_dim, self.continuous)
        else:
            out, value = q_heads(features, self.action_dim, self.head == "dueling")
        return out.reshape(T, B, -1), value.reshape(T, B), self.pack(carry)


class Policy(NamedTuple):
    """What algorithms and acting need: the network with normalization, one step and
    unrolled, and the distribution.

    `apply(params, obs [N, ...], state [N, S])` -> (output, value, new state);
    `unroll(params, obs [T, B, ...], state [B, S], resets [T, B])` -> (output [T, B, ...],
    value [T, B], state after the last step), the state zeroed before each step whose
    `resets` is true. Without a core S is 0, the state passes through untouched and
    `unroll` is `apply` on the T * B rows.
    """

    apply: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]
    unroll: Callable[[Any, jax.Array, jax.Array, jax.Array],
                     tuple[jax.Array, jax.Array, jax.Array]]
    dist: Distribution
    normalize_obs: bool
    state_size: int
    critic: Callable[[Any, jax.Array], jax.Array] | None = None
    """A centralized critic: (params, critic inputs [N, C]) -> values [N]
    (learners/algorithms/critic.py builds the inputs); None: `apply`'s values are the critic's."""
    critic_agents: int = 1
    """Agent columns per env: each env's global state serves this many columns."""
    critic_ids: bool = False
    """Whether the critic also reads each column's one-hot agent id."""
    critic_own_first: bool = False
    """Whether each column reads the global state from its own agent's block on
    (`network.critic_own_first`)."""
    network: Any = None
    """The flax module, for an algorithm that calls its parts itself (MuZero's model:
    representation, dynamics, prediction; a critic of state and action)."""

    @property
    def recurrent(self) -> bool:
        return self.state_size > 0


def make_policy(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    """(policy, flax module) of the network `network.head` names among those the run's
    algorithm declares (`srl_jax.dataflow.algorithms.Network.build`), for `spec`, which
    must carry that network's state size (`actors.envs.policy_spec` or
    `srl_jax.dataflow.env_spec.with_network` gives it); ConfigError if it cannot take
    these spaces."""
    declared = network_of(config)
    check_network(config.network.kind, spec, config.env.id)
    check_spaces(declared, spec, config.env.id)
    return declared.build(config, spec)


def actor_critic_network(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    """The `actor_critic` network (PPO's and IMPALA's): separate MLPs, the Nature-CNN, or a
    recurrent core with linear heads; its distribution samples the actions."""
    network = config.network
    if network.core != "none":
        module: nn.Module = RecurrentActorCritic(
            spec.action_dim, spec.continuous, network.kind, tuple(network.hidden),
            network.activation, network.core, network.core_size, conv_impl(network.conv),
            spec.frame_shape)
    elif network.kind == "nature_cnn":
        module = NatureCNN(spec.action_dim, conv_impl(network.conv), spec.frame_shape)
    else:
        module = ActorCritic(spec.action_dim, spec.continuous, tuple(network.hidden),
                             network.activation, critic_width(config, spec), network.layer_norm)
    return as_policy(config, spec, module, distribution(spec.continuous)), module


def q_network(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    """The `q` or `dueling` network (DQN's and R2D2's): action values on the MLP or
    Nature-CNN torso, with or without a recurrent core; it acts greedily."""
    network = config.network
    conv = conv_impl(network.conv)
    if network.core != "none":
        module: nn.Module = RecurrentActorCritic(
            spec.action_dim, spec.continuous, network.kind, tuple(network.hidden),
            network.activation, network.core, network.core_size, conv, spec.frame_shape,
            network.head)
    else:
        module = QNetwork(spec.action_dim, network.kind, tuple(network.hidden),
                          network.activation, network.head == "dueling", conv, spec.frame_shape)
    return as_policy(config, spec, module, GREEDY), module


def muzero_network(config: ExperimentConfig, spec: EnvSpec) -> tuple[Policy, nn.Module]:
    """The `muzero` network: MuZero's model as a policy (`muzero_policy`)."""
    model = muzero_model(config, spec)
    return muzero_policy(model), model


def critic_ids(config: ExperimentConfig, spec: EnvSpec) -> bool:
    """Whether a centralized critic reads agent ids: as the policy does (`env.agent_id`,
    for a policy of several agents)."""
    return config.env.agent_id and spec.agents > 1


def own_first_critic(config: ExperimentConfig, spec: EnvSpec) -> bool:
    """`network.critic_own_first` where a centralized critic reads a global state. The
    config checks ask for every agent's observation side by side and one policy for
    all agents, which needs equal spaces: the state is one equal block per agent."""
    return config.network.critic_own_first and spec.global_state_size > 0


def critic_width(config: ExperimentConfig, spec: EnvSpec) -> int:
    """Inputs of a centralized critic: the global state and the agent id; 0 without one."""
    if not spec.global_state_size:
        return 0
    return spec.global_state_size + (spec.agents if critic_ids(config, spec) else 0)


def as_policy(config: ExperimentConfig, spec: EnvSpec, network: nn.Module,
              dist: Distribution) -> Policy:
    """`network` as a policy whose actions `dist` reads from its outputs: a module of
    (obs [N, ...]) -> (policy output [N, ...], value [N]) (with a `critic_width`, also of
    critic inputs), or a recurrent one of (obs [T, B, ...], state [B, S], resets [T, B]) ->
    (policy output [T, B, ...], value [T, B], state) with a `state_size`; observations
    normalized where `learner.normalize_obs` says so. What a network builder
    (`srl_jax.dataflow.algorithms.Network.build`) returns, with its module."""
    normalize = config.learner.normalize_obs
    state_size = getattr(network, "state_size", 0)
    if spec.state_size != state_size:
        raise ValueError(f"the spec says {spec.state_size} floats of recurrent state, "
                         f"network.core '{config.network.core}' keeps {state_size}: build "
                         f"the spec with actors.envs.policy_spec")

    def normalized(params: Any, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32)
        if normalize:
            x = jnp.clip((x - params["obs_mean"]) * jax.lax.rsqrt(params["obs_var"] + 1e-8),
                         -OBS_CLIP, OBS_CLIP)
        return x

    if state_size:
        def unroll(params: Any, obs: jax.Array, state: jax.Array, resets: jax.Array) -> tuple:
            return network.apply(params["net"], normalized(params, obs), state, resets)

        def apply(params: Any, obs: jax.Array, state: jax.Array) -> tuple:
            out, value, new_state = unroll(params, obs[None], state,
                                           jnp.zeros((1, obs.shape[0]), bool))
            return out[0], value[0], new_state
    else:
        def apply(params: Any, obs: jax.Array, state: jax.Array) -> tuple:
            return (*network.apply(params["net"], normalized(params, obs)), state)

        def unroll(params: Any, obs: jax.Array, state: jax.Array, resets: jax.Array) -> tuple:
            T, B = resets.shape
            out, value, _ = apply(params, obs.reshape(T * B, *obs.shape[2:]), state)
            return out.reshape(T, B, *out.shape[1:]), value.reshape(T, B), state

    critic = None
    if getattr(network, "critic_width", 0):
        def critic(params: Any, critic_in: jax.Array) -> jax.Array:
            rows = critic_in.shape[0]
            # flax types apply() as its mutable form's (output, variables) or an output
            return network.apply(params["net"], jnp.zeros((rows, *spec.obs_shape)),
                                 critic_in)[1]  # type: ignore[return-value]

    return Policy(apply, unroll, dist, normalize, spec.state_size, critic, spec.agents,
                  critic_ids(config, spec), own_first_critic(config, spec), network)


def muzero_policy(model: MuZeroModel) -> Policy:
    """`model` as a policy: `apply` gives each observation's prior logits and predicted
    value (acting itself searches: its `Network.search_act`); the search and the loss
    call the model's parts through `network`. Observations reach it as they are."""

    def apply(params: Any, obs: jax.Array, state: jax.Array) -> tuple:
        # flax types apply() as its mutable form's (output, variables) or an output
        _, logits, value = model.apply(  # type: ignore[misc]
            params["net"], obs, method=MuZeroModel.initial)
        return logits, from_support(value, model.support_size, model.rescaling_epsilon), state

    def unroll(params: Any, obs: jax.Array, state: jax.Array, resets: jax.Array) -> tuple:
        T, B = resets.shape
        logits, value, _ = apply(params, obs.reshape(T * B, *obs.shape[2:]), state)
        return logits.reshape(T, B, -1), value.reshape(T, B), state

    return Policy(apply, unroll, distribution(False), False, 0, network=model)


def init_policy_params(network: nn.Module, obs_shape: tuple[int, ...],
                       seed: int | jax.Array) -> dict:
    """Parameters from the seed alone, so every worker can build version 0 itself (the
    seed is a uint32 array inside a jitted init: the same key as the int's low 32 bits).
    One jitted call: run op by op, a network's initialisers lower some thirty programs,
    half a second of every JAX worker's start even when the compilation cache holds them."""
    obs = jnp.zeros((1, *obs_shape), jnp.float32)
    inputs: tuple[jax.Array, ...]
    if getattr(network, "state_size", 0):  # a recurrent network
        inputs = (obs[None], jnp.zeros((1, network.state_size), jnp.float32),
                  jnp.zeros((1, 1), bool))
    elif getattr(network, "critic_width", 0):
        inputs = (obs, jnp.zeros((1, network.critic_width)))
    else:
        inputs = (obs,)
    net = jax.jit(network.init)(jax.random.key(seed), *inputs)
    return {"net": net, "obs_mean": jnp.zeros(obs_shape, jnp.float32),
            "obs_var": jnp.ones(obs_shape, jnp.float32),
            "obs_count": jnp.zeros((), jnp.float32)}


def update_obs_stats(params: dict, obs: jax.Array, weights: jax.Array | None = None) -> dict:
    """Merge a batch's observation moments into the running ones (Chan et al.); with
    `weights` (one per observation, 0 or 1: the activity mask), only the weighted ones."""
    x = obs.reshape(-1, *params["obs_mean"].shape).astype(jnp.float32)
    if weights is None:
        count = jnp.asarray(x.shape[0], jnp.float32)
        mean, var = x.mean(0), x.var(0)
    else:
        w = weights.reshape(-1, *([1] * (x.ndim - 1))).astype(jnp.float32)
        count = w.sum()
        mean = (w * x).sum(0) / jnp.maximum(count, 1.0)
        var = (w * jnp.square(x - mean)).sum(0) / jnp.maximum(count, 1.0)
    total = params["obs_count"] + count
    safe = jnp.maximum(total, 1.0)  # no observation yet: the statistics stay as they are
    delta = mean - params["obs_mean"]
    new_mean = params["obs_mean"] + delta * count / safe
    m2 = (params["obs_var"] * params["obs_count"] + var * count
          + jnp.square(delta) * params["obs_count"] * count / safe)
    new_var = jnp.where(total > 0, m2 / safe, params["obs_var"])
    return {**params, "obs_mean": new_mean, "obs_var": new_var, "obs_count": total}
