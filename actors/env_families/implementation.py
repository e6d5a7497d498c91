"""What an env family's implementation does, and how an actor finds the one for its env.

The table in `srl_jax/config/env_families.py` names, for each family and backend, the
'module:attribute' of an `EnvFamilyImplementation`; `implementation_of` imports it then.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

from actors.actor_core import RingSplit
from srl_jax.config.env_families import implementation_name
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec


class EnvFamilyImplementation(ABC):
    """How one family's envs are checked, described and made with one backend."""

    @abstractmethod
    def check_id(self, env: EnvConfig) -> None:
        """ConfigError unless `env.id` names an env this installation can make (before
        launch; cheap: it makes no env)."""

    @abstractmethod
    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        """The spaces of `env` as `policy` sees them (single-agent envs have one policy,
        whatever its name); ConfigError if this version cannot run them."""

    @abstractmethod
    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> RingSplit:
        """`count` envs that step together, seeded with `seeds`: the split an actor's ring
        holds (`actors.env_ring.OnePolicy` around the envs of a single-agent family);
        `global_state`: a multi-agent split also reports each env's global state."""

    def make_env(self, env: EnvConfig, render_mode: str | None = None) -> Any:
        """One gymnasium env of `env` (evaluation, benchmarks); single-agent families."""
        raise ConfigError(f"'env.id': '{env.id}' is a multi-agent environment: it is played "
                          "in a split (make_split), not as one gymnasium env")


def implementation_of(env: EnvConfig) -> EnvFamilyImplementation:
    """The implementation that makes `env`'s envs with `env.backend` (imported now)."""
    module, _, attribute = implementation_name(env).partition(":")
    return getattr(importlib.import_module(module), attribute)

