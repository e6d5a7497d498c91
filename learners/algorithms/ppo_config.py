"""PPO's declaration: its config (`learner.ppo`), its checks, the batch fields it reads,
its network (the actor-critic, which IMPALA trains too).

It imports no JAX, so the launcher checks a config with it before any worker starts;
the math (its optimizer and update builders) is in `learners/algorithms/ppo.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from srl_jax.config.checks import check_fixed_cnn_layers
from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import ACTION_SPACES, Algorithm, Network, Sizes, lazy


@dataclass
class PPOConfig:
    """PPO hyperparameters: the `learner.ppo` section of the experiment config."""

    learning_rate: float = 2.5e-4
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_coef: float = 0.2
    """PPO ratio clipping."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch; they must divide the batch of T * B samples (of B env
    columns for a recurrent policy, whose minibatches are whole columns)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch."""
    clip_value_loss: bool = True
    """Clip the value update around the acting policy's value, as cleanrl does."""
    anneal_lr: bool = False
    """Decay the step size linearly to 0 over the run (needs stop.env_frames)."""
    target_kl: float | None = None
    """Stop an update's remaining epochs once an epoch's approximate KL exceeds this."""
    value_norm: bool = False
    """The critic learns returns standardized by running statistics (MAPPO's value
    normalization, learners/algorithms/value_norm.py), kept in the train state."""
    value_norm_beta: float = 0.999
    """Weight of the old statistics at each update (an exponential moving average)."""
    critic_optimizer: bool = False
    """The value MLP has an Adam and a gradient clip of its own (MAPPO's separate critic
    optimizer): its gradients neither share the policy's clip nor its Adam statistics.
    Needs separate policy and value MLPs (network.kind mlp, network.core none)."""
    critic_lr_scale: float = 1.0
    """With `critic_optimizer`: the critic's step size as a multiple of learning_rate."""

    def __post_init__(self) -> None:
        if self.minibatches < 1:
            raise ConfigError("'learner.ppo.minibatches' must be at least 1")
        if not 0 < self.value_norm_beta < 1:
            raise ConfigError("'learner.ppo.value_norm_beta' must be in (0, 1)")
        if self.epochs < 1:
            raise ConfigError("'learner.ppo.epochs' must be at least 1")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.ppo.gamma' must be in (0, 1]")
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError("'learner.ppo.gae_lambda' must be in [0, 1]")
        if self.learning_rate <= 0:
            raise ConfigError("'learner.ppo.learning_rate' must be positive")
        if self.critic_lr_scale <= 0:
            raise ConfigError("'learner.ppo.critic_lr_scale' must be positive")


def check(config: PPOConfig, sizes: Sizes) -> None:
    """The minibatches split the batch; annealing knows the length of the run."""
    samples = sizes.batch_envs * sizes.trajectory_length
    if sizes.recurrent and sizes.batch_envs % config.minibatches:
        raise ConfigError(
            f"'learner.ppo.minibatches' ({config.minibatches}) must divide "
            f"'learner.batch_envs' ({sizes.batch_envs}): a recurrent policy's minibatches are "
            f"whole env columns")
    if samples % config.minibatches:
        raise ConfigError(
            f"'learner.ppo.minibatches' ({config.minibatches}) must divide the batch of "
            f"{samples} samples (learner.batch_envs * actors.trajectory_length)")
    if config.critic_optimizer and sizes.shared_torso:
        raise ConfigError("'learner.ppo.critic_optimizer' needs separate policy and value "
                          "MLPs: 'network.kind' mlp and 'network.core' none")
    if config.anneal_lr and sizes.total_updates == 0:
        raise ConfigError(
            "'learner.ppo.anneal_lr' needs 'stop.env_frames' to know the length of the run")


def check_actor_critic(config: ExperimentConfig) -> None:
    """What the actor-critic builds: a fixed Nature-CNN; a centralized critic and layer
    norms on separate MLPs only."""
    network = config.network
    check_fixed_cnn_layers(network)
    if network.critic == "global" and network.core != "none":
        raise ConfigError("'network.critic': 'global' needs 'network.core' none")
    if network.layer_norm and (network.kind != "mlp" or network.core != "none"):
        raise ConfigError("'network.layer_norm' normalizes the actor's and the critic's MLPs: "
                          "it needs 'network.kind' mlp and 'network.core' none")


ACTOR_CRITIC = Network(
    head="actor_critic", build=lazy("learners.models.networks", "actor_critic_network"),
    actions=ACTION_SPACES, action_masks=True,
    options=("critic", "critic_own_first", "layer_norm"), check=check_actor_critic)
"""Policy and value (learners/models/networks.py `actor_critic_network`): PPO's, IMPALA's."""

ALGORITHM = Algorithm(
    name="ppo", config=PPOConfig, make_optimizer=lazy("learners.algorithms.ppo", "make_optimizer"),
    make_update=lazy("learners.algorithms.ppo", "make_update"),
    fields=("obs", "actions", "logp", "values", "rewards", "terminated", "truncated",
            "trunc_values", "state", "global_state"),
    networks=(ACTOR_CRITIC,), check=check, live=("learning_rate", "ent_coef", "vf_coef",
                                                 "clip_coef"),
    init_extra=lazy("learners.algorithms.ppo", "init_extra"))
