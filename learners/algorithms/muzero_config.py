"""MuZero's config (Schrittwieser et al. 2020; Gumbel MuZero, Danihelka et al. 2022): the
`learner.muzero` section, and its checks against the sizes.

It imports no JAX. The math is in `learners/algorithms/muzero/`, the model in
`learners/models/muzero_model.py`. Defaults follow MuZero's Atari settings where they
are not about scale (the unroll, the n-step, the value loss's weight, the support, h's
epsilon) and Gumbel MuZero's few simulations.
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
    n_step: int = 10
    """Steps of reward before a value target bootstraps from the search's root value."""
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
    priority_eta: float = 0.9
    """A sequence's priority: eta * max + (1 - eta) * mean over its steps of
    |predicted value - value target| (R2D2's mix)."""
    priority_epsilon: float = 1e-6
    """Added to a sequence's priority so that none is 0."""
    reanalyse_fraction: float = 0.5
    """Of the sequences the replay servers sample, the fraction whose root values and
    search policies they renew by searching again with the newest parameters before
    sending them (MuZero Reanalyze); 0: the acting search's targets only."""

    def __post_init__(self) -> None:
        positive = ("learning_rate", "adam_eps", "max_grad_norm", "value_coef",
                    "rescaling_epsilon", "priority_epsilon")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"'learner.muzero.{name}' must be positive")
        at_least_one = ("n_step", "unroll_steps", "support_size", "latent", "simulations")
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ConfigError(f"'learner.muzero.{name}' must be at least 1")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.muzero.gamma' must be in (0, 1]")
        if self.considered_actions < 2:
            raise ConfigError("'learner.muzero.considered_actions' must be at least 2")
        if not 0 <= self.priority_eta <= 1:
            raise ConfigError("'learner.muzero.priority_eta' must be in [0, 1]")
        if not 0 <= self.reanalyse_fraction <= 1:
            raise ConfigError("'learner.muzero.reanalyse_fraction' must be in [0, 1]")


def check(config: MuZeroConfig, sizes: Sizes) -> None:
    """Each sampled sequence holds an unroll (a recurrent core, and with it a burn-in, is
    refused for the `muzero` head by the network checks)."""
    if config.unroll_steps > sizes.trajectory_length:
        raise ConfigError(f"'learner.muzero.unroll_steps' ({config.unroll_steps}) must not "
                          f"exceed 'actors.trajectory_length' ({sizes.trajectory_length})")


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
    make_optimizer=lazy("learners.algorithms.dqn", "make_optimizer"),  # Adam, clipped
    make_update=lazy("learners.algorithms.muzero.update", "make_update"),
    fields=("obs", "actions", "rewards", "terminated", "truncated", "trunc_values", "values",
            "search_policy", "weights"),
    networks=(MUZERO,),
    replay=Replay(window=lambda config: config.n_step, sequences=True,
                  reanalyse=lambda config: config.reanalyse_fraction),
    check=check, live=("learning_rate",))
