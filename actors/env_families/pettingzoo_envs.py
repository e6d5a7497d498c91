"""The PettingZoo family: 'pettingzoo:<module>' ids, multi-agent, stepped in a
`MultiAgentSplit` (actors/env_families/parallel_envs.py says how ids and agents map)."""

from __future__ import annotations

from actors.env_families.implementation import EnvFamilyImplementation
from actors.env_families.multi_agent import MultiAgentSplit
from actors.env_families.parallel_envs import check_pettingzoo_id, multi_agent_specs
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec


class PettingZooEnvs(EnvFamilyImplementation):
    """PettingZoo parallel environments, each policy's agents a batch of columns."""

    def check_id(self, env: EnvConfig) -> None:
        check_pettingzoo_id(env.id)

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        specs = multi_agent_specs(env)
        if policy not in specs:
            raise ConfigError(f"'env.policies': '{env.id}' has no policy '{policy}' "
                              f"(policies: {', '.join(specs)})")
        return specs[policy]

    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> MultiAgentSplit:
        return MultiAgentSplit(env, count, seeds, global_state)


PETTINGZOO = PettingZooEnvs()
