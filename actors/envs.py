"""Environments by family: make, check and describe the env of a config, whatever its
family (`srl_jax/config/env_families.py` finds it; `actors/env_families/` implements it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, cast

import numpy as np

from actors.actor_core import RingSplit
from actors.env_families.implementation import implementation_of
from srl_jax.config.checks import check_request_rows
from srl_jax.config.env_families import family_of
from srl_jax.config.schema import (
    DEFAULT_POLICY,
    ConfigError,
    EnvConfig,
    ExperimentConfig,
    policy_names,
)
from srl_jax.dataflow.algorithms import algorithm, check_spaces, network_of
from srl_jax.dataflow.env_spec import EnvSpec, check_network, with_network


def make_env(config: EnvConfig, render_mode: str | None = None) -> Any:
    """One gymnasium env of a single-agent family (evaluation, benchmarks)."""
    return implementation_of(config).make_env(config, render_mode)


def make_split(config: EnvConfig, count: int, seeds: list[int],
               global_state: bool = False) -> RingSplit:
    """`count` environments of `config` that step together, seeded with `seeds`: the split
    an actor's ring holds (an `actors.env_ring.OnePolicy` or a `MultiAgentSplit`);
    `global_state`: a multi-agent split also reports each env's global state."""
    return implementation_of(config).make_split(config, count, seeds, global_state)


class TeamSplit(RingSplit, Protocol):
    """A multi-agent split (`MultiAgentSplit`, the JaxMARL family's `JaxSplit`): its
    policies in column order, and a reset that replays the same starts."""

    policies: list[str]

    def reset(self, seeds: list[int]) -> None: ...

    def render(self) -> Any: ...


def make_team_split(config: EnvConfig, seed: int) -> TeamSplit:
    """One environment of `config`'s multi-agent family as a split, seeded with `seed`:
    where a team of policies plays its episodes (`policy.export.play_team_episode`)."""
    if not family_of(config).multi_agent:
        raise ValueError(f"'{config.id}' is not a multi-agent environment")
    return cast(TeamSplit, make_split(config, 1, [seed]))


def env_spec(config: EnvConfig, policy: str = DEFAULT_POLICY) -> EnvSpec:
    """Spaces of `config`'s environment as `policy` sees them; ConfigError if this
    version cannot run it. A single-agent environment has one policy, the default."""
    return implementation_of(config).spec(config, policy)


def check_env_id(config: ExperimentConfig) -> None:
    """ConfigError unless `env.id` names an environment this installation can make (the
    launcher runs it after `srl_jax.config.loader.load_config`, before any worker starts)."""
    implementation_of(config.env).check_id(config.env)


def policy_spec(config: ExperimentConfig, policy: str = DEFAULT_POLICY) -> EnvSpec:
    """What a worker of `policy` needs to know: its env spaces, its recurrent state size,
    whether its actors compute initial priorities from the Q-values, and whether it acts
    by search."""
    spec = with_network(env_spec(config.env, policy), config.network)
    network, sampling = network_of(config), algorithm(config.learner.algorithm).replay
    actor_priorities = (sampling is not None and network.greedy
                        and config.replay.initial_priority == "actor")
    final_obs = (sampling is not None and (not sampling.sequences or sampling.positions)
                 and spec.frame_stack == 1 and spec.agents == 1)
    return dataclasses.replace(spec, action_values=actor_priorities, final_obs=final_obs,
                               search_policy=network.search_act is not None)


def check_policies(config: ExperimentConfig) -> None:
    """ConfigError if a policy's spaces or chunks do not fit the network, the learner's
    batch or the servers' batch (checked before launch)."""
    split_envs = config.actors.envs // config.actors.splits
    sampling = algorithm(config.learner.algorithm).replay
    for policy in policy_names(config.env):
        spec = env_spec(config.env, policy)
        check_network(config.network.kind, spec, config.env.id)
        check_spaces(network_of(config), spec, config.env.id)
        columns = split_envs * spec.agents  # (config_checks already refused 1-agent misfits)
        step = columns * config.learner.processes
        learns = policy not in config.selfplay.frozen  # a frozen policy has no learner
        if not config.replay.count and learns and config.learner.batch_envs % step:
            raise ConfigError(
                f"'learner.batch_envs' ({config.learner.batch_envs}) must be a multiple of "
                f"{step}: policy '{policy}' sends chunks of {columns} columns ({split_envs} "
                f"envs x {spec.agents} agents) to each of {config.learner.processes} learner "
                "process(es)")
        team = spec.agents * config.learner.processes
        if sampling is not None and sampling.teams and config.learner.batch_envs % team:
            raise ConfigError(
                f"'learner.batch_envs' ({config.learner.batch_envs}) must be a multiple of "
                f"{team}: '{config.learner.algorithm}' samples whole teams of {spec.agents} "
                f"agents for each of {config.learner.processes} learner process(es)")
        check_request_rows(config, spec.agents, policy)
    for frozen, source in config.selfplay.opponents.items():
        if _acting_spec(config.env, frozen) != _acting_spec(config.env, source):
            raise ConfigError(f"'selfplay.opponents.{frozen}': policy '{frozen}' cannot play "
                              f"'{source}''s snapshots: their agents' spaces differ")


def _acting_spec(env: EnvConfig, policy: str) -> EnvSpec:
    """What a policy's parameters fit: its spec whatever its number of agents."""
    return dataclasses.replace(env_spec(env, policy), agents=1)


def env_seed(seed: int, actor_index: int, env_index: int) -> int:
    """A distinct, reproducible seed for every environment of every actor."""
    return int(np.random.SeedSequence([seed, actor_index, env_index]).generate_state(1)[0])
