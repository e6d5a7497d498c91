"""R2D2's declaration (Kapturowski et al. 2019): its config (`learner.r2d2`), its checks,
the sampled sequence fields it reads.

It imports no JAX, so the launcher checks a config with it before any worker starts;
the math is in `learners/algorithms/r2d2.py`, the sequence replay in
`replay/sequence_buffer.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from learners.algorithms.dqn_config import DUELING, Q
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import Algorithm, Replay, Sizes, lazy


@dataclass
class R2D2Config:
    """R2D2 hyperparameters: the `learner.r2d2` section of the experiment config. The
    burn-in is `learner.burn_in` (R2D2: 40 of 80-step sequences, which the actors
    overlap by as much)."""

    learning_rate: float = 1e-4
    """Adam step size (R2D2: 1e-4)."""
    adam_eps: float = 1e-3
    """Adam epsilon (R2D2: 1e-3)."""
    gamma: float = 0.997
    """Discount factor (R2D2: 0.997)."""
    n_step: int = 5
    """Steps of each target's window within its sequence (R2D2: 5)."""
    target_update_period: int = 2500
    """Updates between copies of the online network into the target network."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip."""
    double: bool = True
    """Double Q-learning: the online network picks the bootstrap action."""
    priority_eta: float = 0.9
    """A sequence's priority: eta * max |TD error| + (1 - eta) * mean |TD error| (R2D2:
    0.9)."""
    value_rescaling: bool = True
    """Learn h(Q) with h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x (Pohlen et al. 2018),
    in place of clipped rewards."""
    rescaling_epsilon: float = 1e-3
    """The epsilon of h."""
    priority_epsilon: float = 1e-6
    """Added to a sequence's priority so that none is 0."""

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError("'learner.r2d2.learning_rate' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.r2d2.gamma' must be in (0, 1]")
        if self.n_step < 1:
            raise ConfigError("'learner.r2d2.n_step' must be at least 1")
        if self.target_update_period < 1:
            raise ConfigError("'learner.r2d2.target_update_period' must be at least 1")
        if self.max_grad_norm <= 0:
            raise ConfigError("'learner.r2d2.max_grad_norm' must be positive")
        if not 0 <= self.priority_eta <= 1:
            raise ConfigError("'learner.r2d2.priority_eta' must be in [0, 1]")
        if self.rescaling_epsilon <= 0:
            raise ConfigError("'learner.r2d2.rescaling_epsilon' must be positive")
        if self.priority_epsilon <= 0:
            raise ConfigError("'learner.r2d2.priority_epsilon' must be positive")


def check(config: R2D2Config, sizes: Sizes) -> None:
    """The network is recurrent; a target's window stays within the trained part of its
    sequence."""
    if not sizes.recurrent:
        raise ConfigError("'network.core': 'r2d2' replays whole sequences with their "
                          "recurrent state; it needs 'network.core' lstm or gru")
    trained = sizes.trajectory_length - sizes.burn_in
    if config.n_step > trained:
        raise ConfigError(f"'learner.r2d2.n_step' ({config.n_step}) must not exceed the "
                          f"steps trained per sequence ({trained}: actors.trajectory_length "
                          "less learner.burn_in)")


ALGORITHM = Algorithm(
    name="r2d2", config=R2D2Config,
    make_optimizer=lazy("learners.algorithms.dqn", "make_optimizer"),  # Adam, clipped
    make_update=lazy("learners.algorithms.r2d2", "make_update"),
    fields=("obs", "actions", "rewards", "terminated", "truncated", "trunc_values", "state",
            "weights"),
    networks=(DUELING, Q), replay=Replay(window=lambda config: config.n_step, sequences=True),
    check=check, init_extra=lazy("learners.algorithms.dqn", "init_target"),
    live=("learning_rate",))
