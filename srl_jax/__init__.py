"""srl_jax: distributed reinforcement learning over ZeroMQ streams, with JAX learners.

The public API is imported from here: a trained policy (`from srl_jax import load_policy`),
experiment configs, and what a plugin registers (an algorithm, an env family). Each name's
module is imported when the name is first used, so `import srl_jax`, which every process
of a run does (actors and replay servers included), pulls in no JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers (and the layer test) see; `__getattr__` imports them
    from policy.export import TrainedPolicy as TrainedPolicy
    from policy.export import load_policy as load_policy
    from policy.export import load_team as load_team
    from srl_jax.config.env_families import EnvFamily as EnvFamily
    from srl_jax.config.env_families import register_family as register_family
    from srl_jax.config.loader import config_from_dict as config_from_dict
    from srl_jax.config.loader import load_config as load_config
    from srl_jax.config.schema import ConfigError as ConfigError
    from srl_jax.config.schema import ExperimentConfig as ExperimentConfig
    from srl_jax.dataflow.algorithms import Algorithm as Algorithm
    from srl_jax.dataflow.algorithms import register as register

__version__ = "0.1.0"

_MODULES = {
    "policy.export": ("load_policy", "load_team", "TrainedPolicy"),
    "srl_jax.config.loader": ("load_config", "config_from_dict"),
    "srl_jax.config.schema": ("ExperimentConfig", "ConfigError"),
    "srl_jax.dataflow.algorithms": ("Algorithm", "register"),
    "srl_jax.config.env_families": ("EnvFamily", "register_family"),
}
"""Where each public name lives."""
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = ["__version__", *_HOME]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module 'srl_jax' has no attribute '{name}'")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later uses find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
