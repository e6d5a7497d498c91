"""The table of environment families: which ids each one takes, with which backends,
whether it is multi-agent, and where its implementation lives.

A row needs nothing but strings, so the config checks read it without importing an
environment package; the implementations (making, checking and describing the envs)
live in `actors/env_families/`, one module a family, imported by name when an actor
needs them. A family is chosen by `env.id` alone: of the rows whose patterns match it,
the one with the longest pattern. A new family is one module that calls
`register_family` when imported; an experiment names it in `plugins`, which every
process imports.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from srl_jax.config.schema import DEFAULT_BACKEND, ConfigError, EnvConfig


@dataclass(frozen=True)
class EnvFamily:
    """One family of environments, as the config sees it."""

    name: str
    ids: tuple[str, ...]
    """Patterns (fnmatch) of the `env.id`s it takes; '*' takes any id no other matches."""
    implementations: dict[str, str] = field(default_factory=dict)
    """`env.backend` -> the implementation that steps the family's envs with it, as
    'module:attribute' (an `actors.env_families.implementation.EnvFamilyImplementation`)."""
    multi_agent: bool = False
    """Its envs have agents that policies share out (`env.policies`), not one player."""
    extras: tuple[str, ...] = ()
    """The pip extras of srl-jax that install its packages."""


_FAMILIES: dict[str, EnvFamily] = {}


def register_family(family: EnvFamily) -> None:
    """Add `family` to the table (again: replace it)."""
    _FAMILIES[family.name] = family


def families() -> list[EnvFamily]:
    """Every registered family, the shipped ones first."""
    return list(_FAMILIES.values())


def family_of(env: EnvConfig) -> EnvFamily:
    """The family of `env.id`: of the rows with a pattern that matches it, the one whose
    matching pattern is the longest (a specific pattern wins over '*')."""
    best, best_length = None, -1
    for family in _FAMILIES.values():
        for pattern in family.ids:
            if len(pattern) > best_length and fnmatch.fnmatchcase(env.id, pattern):
                best, best_length = family, len(pattern)
    if best is None:
        known = ", ".join(f"'{p}'" for f in _FAMILIES.values() for p in f.ids)
        raise ConfigError(f"'env.id': '{env.id}' belongs to no env family (ids: {known})")
    return best


def backends() -> list[str]:
    """Every `env.backend` some family steps with, the default first."""
    return list(dict.fromkeys(backend for family in _FAMILIES.values()
                              for backend in family.implementations))


def implementation_name(env: EnvConfig) -> str:
    """'module:attribute' of what makes `env`'s envs; ConfigError if its family has none
    for `env.backend`."""
    family = family_of(env)
    try:
        return family.implementations[env.backend]
    except KeyError:
        steps = " or ".join(f"'{b}'" for b in family.implementations)
        raise ConfigError(f"'env.backend': {family.name} environments step with {steps}, "
                          f"not '{env.backend}'") from None


def extras_of(env: EnvConfig) -> list[str]:
    """The pip extras `env` needs: its family's, and its backend's where that is not the
    default (EnvPool's extra is named after it)."""
    own = list(family_of(env).extras)
    return own if env.backend == DEFAULT_BACKEND else [*own, env.backend]


ACTORS = "actors.env_families"
"""The package of the shipped families' implementations."""
ENVPOOL = f"{ACTORS}.envpool_split:ENVPOOL"
MUJOCO_ROBOTS = ("Ant", "HalfCheetah", "Hopper", "Humanoid", "HumanoidStandup",
                 "InvertedDoublePendulum", "InvertedPendulum", "Pusher", "Reacher", "Swimmer",
                 "Walker2d")
SHIPPED = (
    EnvFamily("gymnasium", ("*",), {DEFAULT_BACKEND: f"{ACTORS}.gymnasium_envs:GYMNASIUM",
                                    "envpool": ENVPOOL}),
    EnvFamily("atari", ("ALE/*",), {DEFAULT_BACKEND: f"{ACTORS}.atari:ATARI",
                                    "envpool": f"{ACTORS}.envpool_split:ENVPOOL_ATARI"},
              extras=("atari",)),
    EnvFamily("mujoco", tuple(f"{robot}-v*" for robot in MUJOCO_ROBOTS),
              {DEFAULT_BACKEND: f"{ACTORS}.mujoco:MUJOCO", "envpool": ENVPOOL},
              extras=("mujoco",)),
    EnvFamily("pettingzoo", ("pettingzoo:*",),
              {DEFAULT_BACKEND: f"{ACTORS}.pettingzoo_envs:PETTINGZOO"}, multi_agent=True,
              extras=("multiagent",)),
    EnvFamily("minatar", ("minatar:*",), {DEFAULT_BACKEND: f"{ACTORS}.minatar_envs:MINATAR"},
              extras=("minatar",)),
    EnvFamily("jaxmarl", ("jaxmarl:*",), {DEFAULT_BACKEND: f"{ACTORS}.jax_envs:JAXMARL"},
              multi_agent=True, extras=("jaxmarl",)),
)
"""The families that come with srl_jax; EnvPool (`actors/env_families/envpool_split.py`)
is the 'envpool' backend of three of them."""
for _family in SHIPPED:
    register_family(_family)
