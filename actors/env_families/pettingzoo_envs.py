"""The PettingZoo family: 'pettingzoo:<module>' ids, multi-agent, stepped in a
`MultiAgentSplit` (actors/env_families/parallel_envs.py says how ids and agents map)."""

from __future__ import annotations

from actors.env_families.implementation import EnvFamilyImplementation
from actors.env_families.multi_agent import MultiAgentSplit
from actors.env_families.parallel_envs import check_pettingzoo_id, multi_agent_specs, policy_of
from srl_jax.config.schema import EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec


class PettingZooEnvs(EnvFamilyImplementation):
    """PettingZoo parallel environments, each policy's agents a batch of columns."""

    def check_id(self, env: EnvConfig) -> None:
        check_pettingzoo_id(env.id)

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        return policy_of(multi_agent_specs(env), env, policy)

    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> MultiAgentSplit:
        return MultiAgentSplit(env, count, seeds, global_state)


PETTINGZOO = PettingZooEnvs()
