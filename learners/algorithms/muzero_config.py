"""MuZero's config (Schrittwieser et al. 2020; Gumbel MuZero, Danihelka et al. 2022): the
`learner.muzero` section, and its checks against the sizes.

It imports no JAX. The math is in `learners/algorithms/muzero/`, the model in
`learners/models/muzero_model.py`. Defaults follow MuZero's and MuZero Reanalyze's Atari
settings where they are not about scale (the unroll, the n-step and the target network,
the value loss's weight, the support, h's epsilon, L2 of 1e-4) and Gumbel MuZero's few
simulations. Replay samples single positions (replay/position_buffer.py); MuZero's
priority and importance exponents of 1 are the configs' `replay` section's.
"""

from __future__ import annotations

from dataclasses import dataclass

from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import Algorithm, Network, Replay, Sizes, lazy


@dataclass
class MuZeroConfig:
    """MuZero hyperparameters: the `learner.muzero` section of the experiment config."""

    learning_rate: float = 1e-3
    """Adam step size."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    max_grad_norm: float = 5.0
    """Global gradient-norm clip."""
    gamma: float = 0.997
    """Discount factor (MuZero's Atari: 0.997)."""
    n_step: int = 5
    """Steps of reward before a value target bootstraps from the target network's value
    (MuZero Reanalyze: 5)."""
    unroll_steps: int = 5
    """K: steps the dynamics unrolls from each sampled observation (MuZero: 5)."""
    value_coef: float = 0.25
    """Weight of the value loss (MuZero Reanalyze: 0.25)."""
    support_size: int = 300
    """Values and rewards are distributions over the integers -size..size of h(x)."""
    rescaling_epsilon: float = 1e-3
    """The epsilon of h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x."""
    latent: int = 64
    """Units of the latent state."""
    simulations: int = 16
    """Search simulations per acting step (Gumbel MuZero learns with few)."""
    considered_actions: int = 16
    """Actions Gumbel MuZero's root considers (sequential halving among them)."""
    target_update_period: int = 100
    """Updates between copies of the online network into the target network, whose value
    head the value targets bootstrap from (MuZero Reanalyze)."""
    weight_decay: float = 1e-4
    """L2 regularisation: this times the parameters is added to the gradient (MuZero,
    EfficientZero: 1e-4); 0: none."""
    priority_epsilon: float = 1e-6
    """Added to a position's priority |predicted value - value target| so that none is 0."""
    reanalyse_fraction: float = 0.5
    """Of the positions the replay servers sample, the fraction whose search policies they
    renew by searching again with the newest parameters before sending them (MuZero
    Reanalyze); 0: the acting search's targets only."""

    def __post_init__(self) -> None:
        positive = ("learning_rate", "adam_eps", "max_grad_norm", "value_coef",
                    "rescaling_epsilon", "priority_epsilon")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"'learner.muzero.{name}' must be positive")
        at_least_one = ("n_step", "unroll_steps", "support_size", "latent", "simulations",
                        "target_update_period")
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ConfigError(f"'learner.muzero.{name}' must be at least 1")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.muzero.gamma' must be in (0, 1]")
        if self.considered_actions < 2:
            raise ConfigError("'learner.muzero.considered_actions' must be at least 2")
        if self.weight_decay < 0:
            raise ConfigError("'learner.muzero.weight_decay' must not be negative")
        if not 0 <= self.reanalyse_fraction <= 1:
            raise ConfigError("'learner.muzero.reanalyse_fraction' must be in [0, 1]")


def window(config: MuZeroConfig) -> int:
    """Steps a sampled position carries: its K-step unroll and the n-step window of the
    last unrolled step, whose bootstrap is the window's last observation."""
    return config.unroll_steps + config.n_step


def tail(config: MuZeroConfig, sizes: Sizes) -> int:
    """Steps each chunk repeats of the one before: the window of its last position."""
    return window(config) - 1


def check(config: MuZeroConfig, sizes: Sizes) -> None:
    """Each chunk holds at least one position besides its tail (a recurrent core, and with
    it a burn-in, is refused for the `muzero` head by the network checks)."""
    if tail(config, sizes) >= sizes.trajectory_length:
        raise ConfigError(f"'actors.trajectory_length' ({sizes.trajectory_length}) must exceed "
                          f"the steps each chunk repeats for its last position's targets "
                          f"({tail(config, sizes)}: 'learner.muzero.unroll_steps' + "
                          "'learner.muzero.n_step' - 1)")


def check_model(config: ExperimentConfig) -> None:
    """The model learns its own dynamics from observations as they are."""
    if config.network.core != "none":
        raise ConfigError("'network.head': 'muzero' learns its own dynamics; leave "
                          "'network.core' none")
    if config.learner.normalize_obs:
        raise ConfigError("'learner.normalize_obs': a 'muzero' model reads observations as "
                          "they are")


MUZERO = Network(head="muzero", build=lazy("learners.models.networks", "muzero_network"),
                 check=check_model,
                 search_act=lazy("learners.algorithms.muzero.acting", "make_search_act"))
"""The learned model (learners/models/muzero_model.py), which acts by its search."""

ALGORITHM = Algorithm(
    name="muzero", config=MuZeroConfig,
    make_optimizer=lazy("learners.algorithms.muzero.update", "make_optimizer"),
    make_update=lazy("learners.algorithms.muzero.update", "make_update"),
    fields=("obs", "actions", "rewards", "terminated", "truncated", "trunc_values",
            "final_obs", "search_policy", "weights"),
    networks=(MUZERO,),
    replay=Replay(window=window, sequences=True, positions=True, fields=("action_mask",),
                  reanalyse=lambda config: config.reanalyse_fraction,
                  reanalysed_steps=lambda config: config.unroll_steps + 1),
    check=check, init_extra=lazy("learners.algorithms.dqn", "init_target"),
    overlap=tail, live=("learning_rate",))
