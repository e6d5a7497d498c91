"""PettingZoo parallel environments: importing the module an id names, mapping agents
to policies, and the EnvSpec each policy sees.

A multi-agent environment is named 'pettingzoo:<module>', a module with a
`parallel_env` function (e.g. 'pettingzoo:mpe2.simple_spread_v3'). Its agents
are mapped to policies by `env.policies` (fnmatch patterns; an agent goes to
the first policy that matches it; none given: one 'default' policy for all).
With `env.agent_id`, a policy shared by several agents sees a one-hot of the
agent's place among them after every observation, which is flattened for that;
an image keeps its shape in `EnvSpec.frame_shape`, and the network joins the ids
after its convolutions, never into the pixels.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np

from actors.env_families.spaces import one_hot_discrete, spec_from_spaces
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec

INSTALL_HINT = "pip install -e '.[multiagent]'"
_PACKAGES = ("pettingzoo", "mpe2")
"""Top-level packages the multi-agent extra installs."""
FAMILY_HINTS = {"Box2D": "pip install 'pettingzoo[sisl]'",
                "pymunk": "pip install 'pettingzoo[butterfly]'",
                "pygame": "pip install 'pettingzoo[butterfly]'",
                "chess": "pip install 'pettingzoo[classic]'",
                "rlcard": "pip install 'pettingzoo[classic]'",
                "multi_agent_ale_py": "pip install 'pettingzoo[atari]'"}
"""What installs a dependency of a PettingZoo family that our extra leaves out."""
OBSERVATION, ACTION_MASK = "observation", "action_mask"
"""The keys of a Dict observation that carries its legal actions (PettingZoo's classic
games), and of an `infos[agent]` entry that does."""


def _module_name(env_id: str) -> str:
    """The module of 'pettingzoo:<module>' (the family's pattern in
    `srl_jax/config/env_families.py`)."""
    return env_id.partition(":")[2]


def _import(env_id: str) -> ModuleType:
    name = _module_name(env_id)
    if not name:
        raise ConfigError(f"'env.id': '{env_id}' names no module; write 'pettingzoo:<module>' "
                          "(e.g. 'pettingzoo:mpe2.simple_spread_v3')")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing in _PACKAGES:
            raise ConfigError(f"'env.id': '{env_id}' needs '{missing}', which is not installed: "
                              f"{INSTALL_HINT}") from None
        if missing == name or name.startswith(missing + "."):
            raise ConfigError(f"'env.id': no module '{name}' for '{env_id}'") from None
        hint = FAMILY_HINTS.get(missing.split(".")[0], f"pip install '{missing}'")
        raise ConfigError(f"'env.id': cannot import '{name}': its dependency '{missing}' is "
                          f"not installed: {hint}") from None
    except Exception as error:  # an import can fail in any way
        raise ConfigError(f"'env.id': cannot import '{name}': {_one_line(error)}") from None
    if not callable(getattr(module, "parallel_env", None)):
        raise ConfigError(f"'env.id': module '{name}' has no 'parallel_env' "
                          "(a PettingZoo parallel environment)")
    return module


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def check_pettingzoo_id(env_id: str) -> None:
    """ConfigError unless `env_id` ('pettingzoo:<module>') names an importable module
    with a `parallel_env`."""
    _import(env_id)


def make_parallel_env(config: EnvConfig) -> Any:
    """A new PettingZoo parallel environment: `<module>.parallel_env(**config.kwargs)`."""
    module = _import(config.id)
    try:
        return one_hot_discrete(module.parallel_env(**config.kwargs))
    except ConfigError:
        raise
    except Exception as error:  # environments raise many kinds for bad kwargs
        raise ConfigError(f"'env.kwargs': cannot make '{config.id}': {_one_line(error)}") from None


def agent_policies(config: EnvConfig, agents: list[str]) -> dict[str, list[str]]:
    """Policy name -> its agents (in `agents` order): each agent goes to the first
    policy with a matching pattern; no policies configured: one default policy."""
    if not config.policies:
        return {DEFAULT_POLICY: list(agents)}
    listed = ", ".join(agents)
    mapping: dict[str, list[str]] = {name: [] for name in config.policies}
    for agent in agents:
        policy = next((name for name, patterns in config.policies.items()
                       if any(fnmatch.fnmatchcase(agent, p) for p in patterns)), None)
        if policy is None:
            raise ConfigError(f"'env.policies': agent '{agent}' of '{config.id}' matches no "
                              f"policy (agents: {listed})")
        mapping[policy].append(agent)
    for name, patterns in config.policies.items():
        if mapping[name]:
            continue
        if any(fnmatch.fnmatchcase(a, p) for a in agents for p in patterns):
            raise ConfigError(f"'env.policies': policy '{name}' gets no agent of '{config.id}': "
                              f"earlier policies take all it matches (agents: {listed})")
        raise ConfigError(f"'env.policies': policy '{name}' matches no agent of '{config.id}' "
                          f"(agents: {listed})")
    return mapping


def multi_agent_specs(config: EnvConfig) -> dict[str, EnvSpec]:
    """Policy name -> the EnvSpec its agents observe and act in, in policy order.

    `agents` is the number of the policy's agents in one env (its columns per
    env). Float64 observations are reported (and delivered) as float32; with
    `config.agent_id`, a policy of n > 1 agents observes its flattened observation
    and n more entries (the one-hot), images keeping their shape in `frame_shape`.
    Cached per (id, kwargs, policies, agent_id): making an env can be slow.
    """
    key = (config.id, _freeze(config.kwargs), _freeze(config.policies), config.agent_id)
    try:
        specs = _SPECS.get(key)
    except TypeError:  # unhashable kwargs: no caching
        return _specs(config)
    if specs is None:
        specs = _SPECS[key] = _specs(config)
    return dict(specs)


_SPECS: dict[tuple, dict[str, EnvSpec]] = {}


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return type(value), value  # 1 and True hash alike but may make different envs


def _specs(config: EnvConfig) -> dict[str, EnvSpec]:
    env = make_parallel_env(config)
    try:
        agents = list(env.possible_agents)
        mapping = agent_policies(config, agents)
        _, infos = env.reset(seed=0)
        global_size = _global_state_size(env, agents, config.global_state == "state")
        specs = {}
        for policy, members in mapping.items():
            first = members[0]
            obs_space, action_space = env.observation_space(first), env.action_space(first)
            for other in members[1:]:
                if (env.observation_space(other) != obs_space
                        or env.action_space(other) != action_space):
                    raise ConfigError(f"'env.policies': agents '{first}' and '{other}' of "
                                      f"policy '{policy}' have different spaces")
            dict_mask = is_masked_dict(obs_space)
            if dict_mask:
                obs_space = obs_space[OBSERVATION]
            spec = spec_from_spaces(obs_space, action_space, config.id)
            if spec.obs_dtype == np.float64:
                spec = dataclasses.replace(spec, obs_dtype=np.dtype(np.float32))
            if config.agent_id and len(members) > 1:  # the ids ride after the flat view
                frame = spec.obs_shape if len(spec.obs_shape) != 1 else ()
                spec = dataclasses.replace(
                    spec, obs_shape=(int(np.prod(spec.obs_shape)) + len(members),),
                    frame_shape=frame)
            masked = dict_mask or any(ACTION_MASK in (infos.get(a) or {}) for a in members)
            if masked and spec.continuous:
                raise ConfigError(f"'env.id': '{config.id}' masks the actions of policy "
                                  f"'{policy}', which are continuous: masks need discrete ones")
            specs[policy] = dataclasses.replace(spec, agents=len(members), action_masked=masked,
                                                global_state_size=global_size)
        return specs
    finally:
        env.close()


def policy_of(specs: dict[str, EnvSpec], env: EnvConfig, policy: str) -> EnvSpec:
    """`policy`'s spec among a multi-agent env's `specs`; ConfigError naming the policies
    it has otherwise."""
    if policy not in specs:
        raise ConfigError(f"'env.policies': '{env.id}' has no policy '{policy}' "
                          f"(policies: {', '.join(specs)})")
    return specs[policy]


def is_masked_dict(space: Any) -> bool:
    """Whether an observation space is a Dict of `observation` and `action_mask`."""
    return isinstance(space, gym.spaces.Dict) and OBSERVATION in space.spaces \
        and ACTION_MASK in space.spaces


def _global_state_size(env: Any, agents: list[str], from_state: bool) -> int:
    """Floats of `global_state`: the env's `state()` after a reset (`from_state`), or every
    agent's observation side by side where the env has none or it is not wanted."""
    state = env_state(env) if from_state else None
    if state is not None:
        return int(np.asarray(state).size)
    return sum(flat_size(env.observation_space(a)) for a in agents)


def env_state(env: Any) -> np.ndarray | None:
    """The env's global state now, or None if it keeps none (PettingZoo's base `state()`
    raises NotImplementedError; rock-paper-scissors' `state` is a dict, not callable)."""
    try:
        return env.state()
    except (NotImplementedError, AttributeError, TypeError):
        return None


def flat_size(space: Any) -> int:
    if is_masked_dict(space):
        space = space[OBSERVATION]
    return int(np.prod(space.shape))
