"""IMPALA's declaration: its config (`learner.impala`), its checks, the batch fields it reads.

It imports no JAX, so the launcher checks a config with it before any worker starts;
the math (its optimizer and update builders) is in `learners/algorithms/impala.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from learners.algorithms.ppo_config import ACTOR_CRITIC
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import Algorithm, Sizes, lazy


@dataclass
class ImpalaConfig:
    """IMPALA / V-trace hyperparameters: the `learner.impala` section of the experiment config."""

    learning_rate: float = 6e-4
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    rho_bar: float = 1.0
    """Truncation of importance weights in the V-trace targets."""
    c_bar: float = 1.0
    """Truncation of the trace-cutting coefficients."""
    pg_rho_bar: float = 1.0
    """Truncation of importance weights in the policy-gradient advantages."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip."""
    minibatches: int = 1
    """SGD steps per batch (one pass, split on the env axis); they must divide B."""

    def __post_init__(self) -> None:
        if self.minibatches < 1:
            raise ConfigError("'learner.impala.minibatches' must be at least 1")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.impala.gamma' must be in (0, 1]")
        for key in ("learning_rate", "max_grad_norm", "rho_bar", "c_bar", "pg_rho_bar"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"'learner.impala.{key}' must be positive")


def check(config: ImpalaConfig, sizes: Sizes) -> None:
    """The minibatches split the batch's env columns evenly."""
    if sizes.batch_envs % config.minibatches:
        raise ConfigError(f"'learner.impala.minibatches' ({config.minibatches}) must divide "
                          f"'learner.batch_envs' ({sizes.batch_envs})")


ALGORITHM = Algorithm(
    name="impala", config=ImpalaConfig,
    make_optimizer=lazy("learners.algorithms.impala", "make_optimizer"),
    make_update=lazy("learners.algorithms.impala", "make_update"),
    fields=("obs", "actions", "logp", "rewards", "terminated", "truncated", "trunc_values",
            "state", "global_state"),
    networks=(ACTOR_CRITIC,), check=check, live=("learning_rate", "ent_coef", "vf_coef"))
