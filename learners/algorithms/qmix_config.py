"""QMIX's declaration (Rashid et al. 2018): its config (`learner.qmix`), its checks, the
sampled fields it reads, its network, and how it replays.

QMIX learns a team's action value as a monotonic mix of its agents' recurrent Q-values,
so one row of its batch is not a column but a team: the columns of one env's agents,
side by side, over the same steps (`Replay.teams`: replay/team_buffer.py stores and
samples them together). The sequences are R2D2's (a stored recurrent state per column,
an optional burn-in, `learner.burn_in`), the global state and the legal actions ride
with them. It imports no JAX; the math is in `learners/algorithms/qmix.py`, the
networks in `learners/models/mixer.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.algorithms import Algorithm, Network, Replay, Sizes, lazy


@dataclass
class QMixConfig:
    """QMIX hyperparameters: the `learner.qmix` section of the experiment config."""

    learning_rate: float = 5e-4
    """Adam step size (pymarl and JaxMARL's SMAX: 5e-4; RMSprop in the paper)."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Steps of each target's window within its sequence (QMIX: 1-step TD targets)."""
    target_update_period: int = 200
    """Updates between copies of the online agents and mixer into the target ones."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip over agents and mixer (pymarl: 10)."""
    double: bool = True
    """Double Q-learning: the online agents pick the bootstrap actions (pymarl's
    `double_q`), among the legal ones."""
    mixer_embed: int = 32
    """Units of the mixer's hidden layer (QMIX: 32)."""
    hyper_hidden: int = 64
    """Units of the hidden layer of each hypernetwork that makes the mixer's weights
    (QMIX: 64)."""
    mixer_init_scale: float = 0.001
    """Orthogonal scale of the mixer's output layers (its weights', biases' and V(s)'s) at
    the start (JaxMARL: 0.001).
    At 1, the mixer starts with weights that amplify the agents' overestimates, and its
    targets diverged on MPE spread (Q_tot rising past +90 where returns are -50)."""
    priority_eta: float = 0.9
    """A team sequence's priority: eta * max |TD error| + (1 - eta) * mean (as R2D2's;
    `replay.priority_exponent: 0` samples uniformly, as QMIX's episode buffer does)."""
    priority_epsilon: float = 1e-6
    """Added to a sequence's priority so that none is 0."""

    def __post_init__(self) -> None:
        positive = {"learning_rate": self.learning_rate, "adam_eps": self.adam_eps,
                    "mixer_init_scale": self.mixer_init_scale,
                    "max_grad_norm": self.max_grad_norm,
                    "priority_epsilon": self.priority_epsilon}
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"'learner.qmix.{key}' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.qmix.gamma' must be in (0, 1]")
        for key, value in {"n_step": self.n_step,
                           "target_update_period": self.target_update_period,
                           "mixer_embed": self.mixer_embed,
                           "hyper_hidden": self.hyper_hidden}.items():
            if value < 1:
                raise ConfigError(f"'learner.qmix.{key}' must be at least 1")
        if not 0 <= self.priority_eta <= 1:
            raise ConfigError("'learner.qmix.priority_eta' must be in [0, 1]")


def check(config: QMixConfig, sizes: Sizes) -> None:
    """The agents are recurrent, and a target's window fits the trained steps."""
    if not sizes.recurrent:
        raise ConfigError("'network.core': 'qmix' replays its agents' sequences with their "
                          "recurrent state; it needs 'network.core' gru or lstm")
    trained = sizes.trajectory_length - sizes.burn_in
    if config.n_step > trained:
        raise ConfigError(f"'learner.qmix.n_step' ({config.n_step}) must not exceed the "
                          f"steps each sequence trains ({trained}: "
                          "'actors.trajectory_length' less 'learner.burn_in')")


def check_network(config: ExperimentConfig) -> None:
    """The mixer reads the global state: the network's centralized part."""
    if config.network.critic != "global":
        raise ConfigError("'network.critic': the 'qmix' mixer reads the env's global state; "
                          "set it to 'global'")


QMIX = Network(head="qmix", build=lazy("learners.models.mixer", "qmix_network"), greedy=True,
               action_masks=True, options=("critic",), check=check_network)
"""The agents' recurrent Q network and the monotonic mixer (learners/models/mixer.py)."""

ALGORITHM = Algorithm(
    name="qmix", config=QMixConfig,
    make_optimizer=lazy("learners.algorithms.dqn", "make_optimizer"),  # Adam, clipped
    make_update=lazy("learners.algorithms.qmix", "make_update"),
    fields=("obs", "actions", "rewards", "terminated", "truncated", "state", "weights",
            "global_state", "action_mask", "active"),
    networks=(QMIX,),
    replay=Replay(window=lambda config: config.n_step, sequences=True, teams=True,
                  fields=("global_state", "action_mask", "active")),
    check=check, init_extra=lazy("learners.algorithms.dqn", "init_target"),
    live=("learning_rate",), overlap=lambda config, sizes: sizes.burn_in + 1)
