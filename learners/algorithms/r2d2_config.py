"""R2D2's declaration (Kapturowski et al. 2019): its config (`learner.r2d2`), its checks,
the sampled sequence fields it reads, and the sequences it replays.

Its section sets the sequence geometry, as the paper does: each stored sequence is a
`burn_in` prefix that only warms the recurrent state plus `trained_length` trained
steps, and consecutive sequences of a column start `period` steps apart (40, 80, 40:
120-step chunks overlapping by 80, so each step trains in trained_length / period = 2
sequences). The registry writes the chunk length and burn-in into
`actors.trajectory_length` and `learner.burn_in`, and the overlap into the actors'
chunks (`Algorithm.sequence`, `Algorithm.overlap`).

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
    """R2D2 hyperparameters: the `learner.r2d2` section of the experiment config."""

    burn_in: int = 40
    """Steps at the start of each sequence that only warm the stored state (R2D2: 40)."""
    trained_length: int = 80
    """Steps after the burn-in that each sequence trains (R2D2: 80)."""
    period: int = 40
    """Steps between the starts of consecutive sequences of a column (R2D2: 40)."""
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
        if self.burn_in < 0:
            raise ConfigError("'learner.r2d2.burn_in' must not be negative")
        if self.trained_length < 1:
            raise ConfigError("'learner.r2d2.trained_length' must be at least 1")
        if self.period < 1:
            raise ConfigError("'learner.r2d2.period' must be at least 1")
        if self.period > self.trained_length:  # here, before the overlap it sets is checked
            raise ConfigError(f"'learner.r2d2.period' ({self.period}) must not exceed "
                              f"'learner.r2d2.trained_length' ({self.trained_length}): the "
                              "steps between one sequence's trained part and the next's "
                              "would never train")
        if self.learning_rate <= 0:
            raise ConfigError("'learner.r2d2.learning_rate' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.r2d2.gamma' must be in (0, 1]")
        if not 1 <= self.n_step <= self.trained_length:
            raise ConfigError(f"'learner.r2d2.n_step' ({self.n_step}) must be in [1, "
                              f"learner.r2d2.trained_length ({self.trained_length})]: a "
                              "target's window stays within the steps its sequence trains")
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
    """The network is recurrent."""
    if not sizes.recurrent:
        raise ConfigError("'network.core': 'r2d2' replays whole sequences with their "
                          "recurrent state; it needs 'network.core' lstm or gru")


ALGORITHM = Algorithm(
    name="r2d2", config=R2D2Config,
    make_optimizer=lazy("learners.algorithms.dqn", "make_optimizer"),  # Adam, clipped
    make_update=lazy("learners.algorithms.r2d2", "make_update"),
    fields=("obs", "actions", "rewards", "terminated", "truncated", "trunc_values", "state",
            "weights"),
    networks=(DUELING, Q), replay=Replay(window=lambda config: config.n_step, sequences=True),
    check=check, init_extra=lazy("learners.algorithms.dqn", "init_target"),
    live=("learning_rate",),
    sequence=lambda config: (config.burn_in + config.trained_length, config.burn_in),
    overlap=lambda config, sizes: sizes.trajectory_length - config.period)
