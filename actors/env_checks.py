"""Checks of `env.id` that need the environment packages (gymnasium, ALE, PettingZoo).

The config modules import no environment package; the launcher runs these after
`srl_jax.config.loader.load_config` and before any worker starts.
"""

from __future__ import annotations

import difflib
import importlib

import gymnasium

from actors.atari import is_atari, register_atari
from actors.multi_agent import check_pettingzoo_id
from srl_jax.config.schema import ConfigError, ExperimentConfig, is_pettingzoo


def check_env_id(config: ExperimentConfig) -> None:
    """ConfigError unless `env.id` names an environment this installation can make."""
    env_id = config.env.id
    if is_pettingzoo(env_id):
        check_pettingzoo_id(env_id)
        return
    if is_atari(env_id):
        register_atari(env_id)
    if ":" in env_id:  # gymnasium's "module:EnvId"
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)  # registers the environment
        except Exception as error:
            raise ConfigError(f"'env.id': cannot import '{module}' for '{config.env.id}': "
                              f"{error}") from None
    if env_id not in gymnasium.envs.registry:
        close = difflib.get_close_matches(env_id, list(gymnasium.envs.registry), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"'env.id': unknown gymnasium environment '{env_id}'{hint}")
