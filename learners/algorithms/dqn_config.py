"""Ape-X DQN's declaration: its config (`learner.dqn`), its checks, the replay fields it
reads, its networks (the Q networks, which R2D2 trains too).

It imports no JAX, so the launcher checks a config with it before any worker starts;
the math (its optimizer and update builders) is in `learners/algorithms/dqn.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from srl_jax.config.checks import check_fixed_cnn_layers
from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import Algorithm, Network, Replay, Sizes, lazy


@dataclass
class DQNConfig:
    """DQN hyperparameters: the `learner.dqn` section of the experiment config."""

    learning_rate: float = 2.5e-4
    """Adam step size."""
    adam_eps: float = 1.5e-4
    """Adam epsilon (Ape-X and Rainbow use 1.5e-4, not 1e-8)."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Steps of each sampled window: the n of the n-step target."""
    target_update_period: int = 2500
    """Updates between copies of the online network into the target network."""
    huber_delta: float = 1.0
    """Huber loss: quadratic within this TD error, linear beyond."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip (Ape-X: 40)."""
    double: bool = True
    """Double DQN: the online network picks the bootstrap action, the target scores it."""
    priority_epsilon: float = 1e-6
    """Added to |TD error| so that no transition's priority is 0."""

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError("'learner.dqn.learning_rate' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.dqn.gamma' must be in (0, 1]")
        if self.n_step < 1:
            raise ConfigError("'learner.dqn.n_step' must be at least 1")
        if self.target_update_period < 1:
            raise ConfigError("'learner.dqn.target_update_period' must be at least 1")
        if self.huber_delta <= 0:
            raise ConfigError("'learner.dqn.huber_delta' must be positive")
        if self.max_grad_norm <= 0:
            raise ConfigError("'learner.dqn.max_grad_norm' must be positive")
        if self.priority_epsilon <= 0:
            raise ConfigError("'learner.dqn.priority_epsilon' must be positive")


def check(config: DQNConfig, sizes: Sizes) -> None:
    """A window never spans chunks: n may not exceed the chunk length."""
    if config.n_step > sizes.trajectory_length:
        raise ConfigError(f"'learner.dqn.n_step' ({config.n_step}) must not exceed "
                          f"'actors.trajectory_length' ({sizes.trajectory_length}): a window "
                          "ends with its chunk")


def check_q(config: ExperimentConfig) -> None:
    """A Q network on the Nature-CNN takes its layers as they are."""
    check_fixed_cnn_layers(config.network)


DUELING = Network(head="dueling", build=lazy("learners.models.networks", "q_network"),
                  greedy=True, check=check_q)
"""Action values as a state value plus advantages (learners/models/networks.py
`q_network`): DQN's and R2D2's."""
Q = dataclasses.replace(DUELING, head="q")
"""Action values from one linear head: DQN's and R2D2's."""

ALGORITHM = Algorithm(
    name="dqn", config=DQNConfig, make_optimizer=lazy("learners.algorithms.dqn", "make_optimizer"),
    make_update=lazy("learners.algorithms.dqn", "make_update"),
    fields=("obs", "actions", "rewards", "steps", "terminated", "truncated", "trunc_values",
            "next_obs", "weights"),
    networks=(DUELING, Q), replay=Replay(window=lambda config: config.n_step), check=check,
    init_extra=lazy("learners.algorithms.dqn", "init_target"), live=("learning_rate",))
