"""Multi-agent environments: specs, agent-to-policy mapping, and MultiAgentSplit over real MPE.

Twin `parallel_env`s reset with the same seeds and stepped with the same
actions are the oracle for what the split's columns must hold. Agents that
finish at different times are played by `ToyEnv` below, addressed as
'pettingzoo:tests.test_multi_agent_env' (this module has a `parallel_env`).
"""

from __future__ import annotations

import sys

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest
from mpe2 import simple_adversary_v3, simple_spread_v3
from pettingzoo import ParallelEnv

from actors.env_families.multi_agent import MultiAgentSplit
from actors.env_families.parallel_envs import (
    INSTALL_HINT,
    agent_policies,
    check_pettingzoo_id,
    multi_agent_specs,
)
from learners.algorithms.critic import critic_inputs
from learners.models.networks import init_policy_params, make_policy
from srl_jax.config.checks import validate
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.dataflow.env_spec import EnvSpec, with_network
from tests.conftest import make_config

SPREAD = {"N": 3, "max_cycles": 25, "continuous_actions": False}
TOY = "pettingzoo:tests.test_multi_agent_env"


def spread(**fields) -> EnvConfig:
    return EnvConfig(id="pettingzoo:mpe2.simple_spread_v3", kwargs=dict(SPREAD), **fields)


def twins(seeds: list[int]) -> tuple[list, list[dict]]:
    """Plain simple_spread envs reset with `seeds`, and their first observations."""
    envs = [simple_spread_v3.parallel_env(**SPREAD) for _ in seeds]
    return envs, [env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)]


def stacked(observed: list[dict], agents: list[str]) -> np.ndarray:
    """Env-major rows of `agents`' observations (the split's column order)."""
    return np.stack([obs[agent] for obs in observed for agent in agents])


# --------------------------------------------------------------------------- MPE


def test_spread_specs_with_and_without_agent_id():
    assert multi_agent_specs(spread()) == {
        "default": EnvSpec((21,), np.dtype(np.float32), 5, continuous=False, agents=3,
                           global_state_size=54)}
    assert multi_agent_specs(spread(agent_id=False))["default"].obs_shape == (18,)
    specs = multi_agent_specs(spread())
    specs.clear()  # callers get a copy of the cached specs
    assert list(multi_agent_specs(spread())) == ["default"]


def test_spread_split_matches_twin_envs_through_truncation_and_reset():
    seeds = [3, 4]
    agents = ["agent_0", "agent_1", "agent_2"]
    split = MultiAgentSplit(spread(), 2, seeds)
    references, first = twins(seeds)
    assert len(split) == 2 and split.policies == ["default"]
    assert split.agents == {"default": agents}
    ids = np.tile(np.eye(3, dtype=np.float32), (2, 1))
    (obs,) = split.obs
    assert obs.shape == (6, 21) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs[:, 18:], ids)
    np.testing.assert_array_equal(obs[:, :18], stacked(first, agents))

    rng = np.random.default_rng(0)
    returns = np.zeros(6)
    for step in range(1, 26):
        actions = [int(a) for a in rng.integers(0, 5, 6)]
        ring = split.step([actions])
        (result,) = ring.results
        expected = [ref.step({a: actions[i * 3 + k] for k, a in enumerate(agents)})
                    for i, ref in enumerate(references)]
        rewards = np.array([r[1][a] for r in expected for a in agents])
        np.testing.assert_allclose(result.rewards, rewards, rtol=1e-6)
        assert result.rewards.dtype == np.float32
        returns += rewards
        assert not result.terminated.any()
        ended = step == 25
        assert result.truncated.all() == ended and result.truncated.any() == ended
        final = stacked([r[0] for r in expected], agents)
        if not ended:
            assert ring.episode_returns == [] and result.episode_returns == []
            assert result.truncated_envs.size == 0 and result.final_obs.shape == (0, 21)
            np.testing.assert_array_equal(result.next_obs[:, :18], final)
            continue
        np.testing.assert_array_equal(result.truncated_envs, np.arange(6))
        assert result.final_obs.shape == (6, 21)
        np.testing.assert_array_equal(result.final_obs[:, :18], final)
        np.testing.assert_array_equal(result.final_obs[:, 18:], ids)
        np.testing.assert_allclose(result.episode_returns, returns, rtol=1e-5)
        assert result.episode_lengths == [25] * 6
        np.testing.assert_allclose(ring.episode_returns, returns.reshape(2, 3).sum(1), rtol=1e-5)
        assert ring.episode_lengths == [25, 25]
        assert all(ref.agents == [] for ref in references)
        # The split reset its envs: next_obs is the new episode's first observation.
        restarted = [ref.reset()[0] for ref in references]
        np.testing.assert_array_equal(result.next_obs[:, :18], stacked(restarted, agents))
        np.testing.assert_array_equal(result.next_obs[:, 18:], ids)
        assert split.obs[0] is result.next_obs

    ring = split.step([[0] * 6])
    expected = [ref.step({a: 0 for a in agents}) for ref in references]
    np.testing.assert_allclose(ring.results[0].rewards,
                               [r[1][a] for r in expected for a in agents], rtol=1e-6)
    np.testing.assert_array_equal(ring.results[0].next_obs[:, :18],
                                  stacked([r[0] for r in expected], agents))
    split.close()


def test_a_global_state_of_observations_side_by_side_skips_the_state_call(monkeypatch):
    seeds = [3, 4]
    calls = []
    state = simple_spread_v3.raw_env.state
    monkeypatch.setattr(simple_spread_v3.raw_env, "state",
                        lambda self: calls.append(1) or state(self))
    from_state = MultiAgentSplit(spread(), 2, seeds, global_state=True)
    calls.clear()
    from_obs = MultiAgentSplit(spread(global_state="observations"), 2, seeds, global_state=True)
    np.testing.assert_array_equal(from_obs.global_state, from_state.global_state)
    rng = np.random.default_rng(0)
    for _ in range(30):  # through the truncation at 25 and the reset
        actions = [[int(a) for a in rng.integers(0, 5, 6)]]
        b = from_obs.step(actions).results[0]
        assert not calls, "observations side by side: no state() call"
        a = from_state.step(actions).results[0]
        assert calls, "the default asks the env"
        calls.clear()
        np.testing.assert_array_equal(b.global_state, a.global_state)  # MPE: the same
        np.testing.assert_array_equal(b.final_global_state, a.final_global_state)
    from_state.close()
    from_obs.close()


def test_an_own_first_critic_reads_the_team_from_each_agent_on():
    state = jnp.arange(12, dtype=jnp.float32).reshape(1, 2, 6)  # 2 envs, 3 agents x 2
    turned = np.asarray(critic_inputs(state, 3, ids=False, own_first=True))
    assert turned.shape == (1, 6, 6)
    np.testing.assert_array_equal(turned[0, 0], [0, 1, 2, 3, 4, 5])  # env 0, agent 0
    np.testing.assert_array_equal(turned[0, 1], [2, 3, 4, 5, 0, 1])  # env 0, agent 1
    np.testing.assert_array_equal(turned[0, 5], [10, 11, 6, 7, 8, 9])  # env 1, agent 2
    fixed = np.asarray(critic_inputs(state, 3, ids=True))
    np.testing.assert_array_equal(fixed[0, 5], [6, 7, 8, 9, 10, 11, 0, 0, 1])

    keys = ["env.id=pettingzoo:mpe2.simple_spread_v3", "network.critic=global",
            "env.kwargs={N: 3, max_cycles: 25, continuous_actions: false}",
            "network.critic_own_first=true", "learner.algorithm=ppo"]
    config = make_config([*keys, "env.global_state=observations"])
    validate(config)
    spec = with_network(multi_agent_specs(config.env)["default"], config.network)
    policy, _ = make_policy(config, spec)
    assert policy.critic_own_first and policy.critic_ids and policy.critic_agents == 3
    with pytest.raises(ConfigError, match=r"'env\.global_state' observations"):
        validate(make_config(keys))  # state(): the env's layout, not known to be blocks


def test_layer_norm_makes_actor_and_critic_blind_to_each_rows_scale_and_offset():
    """`network.layer_norm` (MAPPO's MLP) normalizes each input row first: a row scaled
    by a positive factor and shifted gives the same logits and values."""
    keys = ["env.id=pettingzoo:mpe2.simple_spread_v3", "network.critic=global",
            "env.kwargs={N: 3, max_cycles: 25, continuous_actions: false}",
            "env.global_state=observations", "learner.algorithm=ppo"]
    rng = np.random.default_rng(0)
    outputs = {}
    for layer_norm in (False, True):
        config = make_config([*keys, f"network.layer_norm={str(layer_norm).lower()}"])
        validate(config)
        spec = with_network(multi_agent_specs(config.env)["default"], config.network)
        policy, network = make_policy(config, spec)
        params = init_policy_params(network, spec.obs_shape, 0)
        norms = [name for name in params["net"]["params"]["critic"] if "LayerNorm" in name]
        assert len(norms) == (3 if layer_norm else 0)  # the inputs, then each hidden layer
        obs = rng.normal(size=(4, *spec.obs_shape)).astype(np.float32)
        critic_in = rng.normal(size=(4, network.critic_width)).astype(np.float32)
        scale, shift = np.float32([[0.5], [2.0], [3.0], [10.0]]), np.float32([[1], [-2], [0], [5]])
        outputs[layer_norm] = [
            (policy.apply(params, x, jnp.zeros((4, 0)))[0], policy.critic(params, c))
            for x, c in ((obs, critic_in), (obs * scale + shift, critic_in * scale + shift))]
    (logits, values), (moved_logits, moved_values) = outputs[True]
    np.testing.assert_allclose(moved_logits, logits, atol=1e-4)
    np.testing.assert_allclose(moved_values, values, atol=1e-4)
    (logits, values), (moved_logits, moved_values) = outputs[False]
    assert not np.allclose(moved_values, values, atol=1e-2), "plain MLPs see the scale"
    with pytest.raises(ConfigError, match=r"'network\.layer_norm'.*'network\.core' none"):
        algorithm_config(make_config(["network.layer_norm=true", "network.core=gru"]))


def test_two_policies_split_agents_into_columns():
    config = spread(policies={"first": ["agent_0"], "rest": ["agent_*"]})
    specs = multi_agent_specs(config)
    assert list(specs) == ["first", "rest"]
    assert (specs["first"].agents, specs["first"].obs_shape) == (1, (18,)), "no id for one"
    assert (specs["rest"].agents, specs["rest"].obs_shape) == (2, (20,))
    split = MultiAgentSplit(config, 2, [5, 6])
    references, first = twins([5, 6])
    assert split.policies == ["first", "rest"]
    assert split.agents == {"first": ["agent_0"], "rest": ["agent_1", "agent_2"]}
    assert [obs.shape for obs in split.obs] == [(2, 18), (4, 20)]
    np.testing.assert_array_equal(split.obs[0], stacked(first, ["agent_0"]))
    np.testing.assert_array_equal(split.obs[1][:, :18], stacked(first, ["agent_1", "agent_2"]))
    np.testing.assert_array_equal(split.obs[1][:, 18:], np.tile(np.eye(2), (2, 1)))

    ring = split.step([[1, 2], [3, 4, 0, 1]])
    expected = [references[0].step({"agent_0": 1, "agent_1": 3, "agent_2": 4}),
                references[1].step({"agent_0": 2, "agent_1": 0, "agent_2": 1})]
    first_result, rest_result = ring.results
    np.testing.assert_array_equal(first_result.next_obs, stacked([r[0] for r in expected],
                                                                 ["agent_0"]))
    np.testing.assert_array_equal(rest_result.next_obs[:, :18],
                                  stacked([r[0] for r in expected], ["agent_1", "agent_2"]))
    assert first_result.rewards.shape == (2,) and rest_result.rewards.shape == (4,)
    split.close()


def test_adversary_policies_with_different_spaces():
    config = EnvConfig(id="pettingzoo:mpe2.simple_adversary_v3",
                       policies={"adversary": ["adversary_*"], "good": ["agent_*"]})
    specs = multi_agent_specs(config)
    assert specs["adversary"].obs_shape == (8,) and specs["good"].obs_shape == (12,)
    split = MultiAgentSplit(config, 1, [0])
    reference = simple_adversary_v3.parallel_env()
    first, _ = reference.reset(seed=0)
    np.testing.assert_array_equal(split.obs[0], [first["adversary_0"]])
    np.testing.assert_array_equal(split.obs[1][:, :10], [first["agent_0"], first["agent_1"]])
    split.close()

    mixed = EnvConfig(id=config.id, policies={"mixed": ["adversary_0", "agent_0"],
                                              "other": ["agent_1"]})
    with pytest.raises(ConfigError, match="agents 'adversary_0' and 'agent_0' of policy 'mixed' "
                                          "have different spaces"):
        multi_agent_specs(mixed)


# --------------------------------------------------------------------------- errors


def _error(call) -> str:
    with pytest.raises(ConfigError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_bad_ids():
    assert _error(lambda: check_pettingzoo_id("pettingzoo:no_such_module_xyz")).startswith(
        "'env.id': no module 'no_such_module_xyz'")
    assert _error(lambda: check_pettingzoo_id("pettingzoo:mpe2.no_such_env_v0")).startswith(
        "'env.id': no module 'mpe2.no_such_env_v0'")
    assert _error(lambda: check_pettingzoo_id("pettingzoo:json")) == (
        "'env.id': module 'json' has no 'parallel_env' (a PettingZoo parallel environment)")
    assert _error(lambda: check_pettingzoo_id("pettingzoo:")).startswith("'env.id': ")
    check_pettingzoo_id("pettingzoo:mpe2.simple_spread_v3")


def test_missing_packages_point_to_the_extra(tmp_path, monkeypatch):
    (tmp_path / "srl_needs_pettingzoo.py").write_text("import pettingzoo\n")
    (tmp_path / "srl_needs_a_dependency.py").write_text("import srl_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "pettingzoo", None)  # as if it were not installed
    message = _error(lambda: check_pettingzoo_id("pettingzoo:srl_needs_pettingzoo"))
    assert message.startswith("'env.id': ") and "'pettingzoo'" in message
    assert message.endswith(INSTALL_HINT)
    message = _error(lambda: check_pettingzoo_id("pettingzoo:srl_needs_a_dependency"))
    assert message.endswith("its dependency 'srl_not_installed_xyz' is not installed: "
                            "pip install 'srl_not_installed_xyz'")
    (tmp_path / "srl_needs_box2d.py").write_text("import Box2D\n")  # multiwalker's
    monkeypatch.setitem(sys.modules, "Box2D", None)
    message = _error(lambda: check_pettingzoo_id("pettingzoo:srl_needs_box2d"))
    assert message.endswith("its dependency 'Box2D' is not installed: "
                            "pip install 'pettingzoo[sisl]'")


def test_bad_policies_and_kwargs():
    agents = ["agent_0", "agent_1", "agent_2"]
    config = spread(policies={"first": ["agent_0"]})
    assert _error(lambda: agent_policies(config, agents)) == (
        "'env.policies': agent 'agent_1' of 'pettingzoo:mpe2.simple_spread_v3' matches no "
        "policy (agents: agent_0, agent_1, agent_2)")
    config = spread(policies={"agents": ["agent_*"], "ghosts": ["ghost_*", "zombie"]})
    assert _error(lambda: multi_agent_specs(config)) == (
        "'env.policies': policy 'ghosts' matches no agent of 'pettingzoo:mpe2.simple_spread_v3' "
        "(agents: agent_0, agent_1, agent_2)")
    config = spread(policies={"all": ["*"], "first": ["agent_0"]})
    assert _error(lambda: agent_policies(config, agents)).startswith(
        "'env.policies': policy 'first' gets no agent")
    assert agent_policies(spread(), agents) == {"default": agents}

    config = EnvConfig(id="pettingzoo:mpe2.simple_spread_v3", kwargs={"N": 3, "bogus": 1})
    assert _error(lambda: multi_agent_specs(config)).startswith(
        "'env.kwargs': cannot make 'pettingzoo:mpe2.simple_spread_v3': ")


# ------------------------------------------------------------------- agents that finish early


class ToyEnv(ParallelEnv):
    """Agent a_k lives `lives[k]` steps, then terminates; all are truncated after
    `max_steps`. It observes [step, k] (float64) and is rewarded its action + 10 k.
    Actions must come exactly from the live agents."""

    metadata = {"name": "toy_v0"}

    def __init__(self, lives: list[int], max_steps: int = 100,
                 obs_shape: tuple[int, ...] = (2,)) -> None:
        self.lives, self.max_steps = lives, max_steps
        self.possible_agents = [f"a_{k}" for k in range(len(lives))]
        self.agents: list[str] = []
        self._obs_space = gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float64)
        self._action_space = gym.spaces.Discrete(3)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._action_space

    def _observe(self) -> dict:
        return {a: np.full(self._obs_space.shape, [self.t, int(a[2:])]) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        rewards = {a: float(actions[a] + 10 * int(a[2:])) for a in self.agents}
        term = {a: self.t >= self.lives[int(a[2:])] for a in self.agents}
        trunc = {a: self.t >= self.max_steps for a in self.agents}
        obs = self._observe()
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, {a: {} for a in obs}


def parallel_env(**kwargs) -> ToyEnv:
    return ToyEnv(**kwargs)


def test_agent_done_early_observes_zeros_until_the_env_resets():
    config = EnvConfig(id=TOY, kwargs={"lives": [2, 4]})
    spec = multi_agent_specs(config)["default"]
    assert spec == EnvSpec((4,), np.dtype(np.float32), 3, continuous=False, agents=2,
                           global_state_size=4)  # no state(): both agents' observations
    split = MultiAgentSplit(config, 2, [0, 1])
    ids = np.tile(np.eye(2, dtype=np.float32), (2, 1))
    np.testing.assert_array_equal(split.obs[0], np.hstack([[[0, 0], [0, 1]] * 2, ids]))
    assert split.obs[0].dtype == np.float32

    def step(actions):
        ring = split.step([actions])
        return ring, ring.results[0]

    ring, r = step([1, 2, 0, 1])
    np.testing.assert_array_equal(r.rewards, [1, 12, 0, 11])
    np.testing.assert_array_equal(r.next_obs[:, :2], [[1, 0], [1, 1], [1, 0], [1, 1]])
    assert not r.terminated.any() and not r.truncated.any()

    ring, r = step([2, 0, 1, 1])  # a_0 terminates
    np.testing.assert_array_equal(r.rewards, [2, 10, 1, 11])
    np.testing.assert_array_equal(r.terminated, [True, False, True, False])
    np.testing.assert_array_equal(r.next_obs, np.hstack([[[0, 0], [2, 1]] * 2, ids]))
    assert ring.episode_returns == [] and r.episode_returns == []

    ring, r = step([2, 1, 2, 1])  # a_0's actions are not sent (ToyEnv would fail)
    np.testing.assert_array_equal(r.rewards, [0, 11, 0, 11])
    np.testing.assert_array_equal(r.terminated, [True, False, True, False])
    np.testing.assert_array_equal(r.next_obs, np.hstack([[[0, 0], [3, 1]] * 2, ids]))

    ring, r = step([0, 2, 0, 0])  # a_1 terminates: the episode ends, the envs reset
    np.testing.assert_array_equal(r.rewards, [0, 12, 0, 10])
    assert r.terminated.all() and not r.truncated.any() and r.truncated_envs.size == 0
    np.testing.assert_array_equal(r.next_obs, np.hstack([[[0, 0], [0, 1]] * 2, ids]))
    assert r.episode_returns == [3, 45, 1, 43] and r.episode_lengths == [2, 4, 2, 4]
    assert ring.episode_returns == [48, 44] and ring.episode_lengths == [4, 4]

    ring, r = step([1, 1, 1, 1])  # the new episode counts from zero
    np.testing.assert_array_equal(r.rewards, [1, 11, 1, 11])
    assert not r.terminated.any()
    split.close()


def test_truncation_after_an_agent_is_done():
    config = EnvConfig(id=TOY, kwargs={"lives": [1, 10], "max_steps": 2})
    split = MultiAgentSplit(config, 1, [0])
    r = split.step([[1, 1]]).results[0]
    np.testing.assert_array_equal(r.terminated, [True, False])
    ring = split.step([[0, 2]])
    r = ring.results[0]
    np.testing.assert_array_equal(r.rewards, [0, 12])
    np.testing.assert_array_equal(r.terminated, [True, False])
    np.testing.assert_array_equal(r.truncated, [False, True])
    np.testing.assert_array_equal(r.truncated_envs, [1])
    np.testing.assert_array_equal(r.final_obs, [[2, 1, 0, 1]])
    assert r.final_obs.dtype == np.float32
    assert ring.episode_returns == [24] and ring.episode_lengths == [2]
    assert r.episode_lengths == [1, 2]
    split.close()


def test_agent_ids_ride_after_flattened_observations_of_any_shape():
    config = EnvConfig(id=TOY, kwargs={"lives": [3, 3], "obs_shape": [2, 2]})
    spec = multi_agent_specs(config)["default"]
    assert spec.obs_shape == (6,) and spec.frame_shape == (2, 2)
    split = MultiAgentSplit(config, 1, [0])
    np.testing.assert_array_equal(split.obs[0], [[0, 0, 0, 0, 1, 0], [0, 1, 0, 1, 0, 1]])
    split.close()
    config = EnvConfig(id=TOY, kwargs={"lives": [1, 1], "obs_shape": [2, 2]}, agent_id=False)
    spec = multi_agent_specs(config)["default"]
    assert spec.obs_shape == (2, 2) and spec.frame_shape == ()


def test_a_convolutional_policy_reads_agent_ids_beside_its_frames_not_in_them():
    config = make_config([f"env.id={TOY}", "env.kwargs={lives: [3, 3], obs_shape: [36, 36, 2]}",
                          "network.kind=nature_cnn"])
    spec = with_network(multi_agent_specs(config.env)["default"], config.network)
    assert spec.obs_shape == (36 * 36 * 2 + 2,) and spec.frame_shape == (36, 36, 2)
    policy, network = make_policy(config, spec)
    params = init_policy_params(network, spec.obs_shape, seed=0)
    assert params["net"]["params"]["Conv_0"]["kernel"].shape[2] == 2, "ids are no channel"
    frame = np.random.default_rng(0).integers(0, 255, 36 * 36 * 2).astype(np.float32)
    rows = np.stack([np.concatenate([frame, ids]) for ids in ([1, 0], [0, 1], [1, 0])])
    out, values, _ = policy.apply(params, rows, np.zeros((3, 0), np.float32))
    out, values = np.asarray(out), np.asarray(values)
    assert not np.allclose(out[0], out[1]) and not np.isclose(values[0], values[1])
    np.testing.assert_array_equal(out[0], out[2])


def test_continuous_actions_reach_the_env():
    config = EnvConfig(id="pettingzoo:mpe2.simple_spread_v3",
                       kwargs=dict(SPREAD, continuous_actions=True))
    spec = multi_agent_specs(config)["default"]
    assert spec.continuous and spec.action_dim == 5
    assert spec.action_low == (0.0,) * 5 and spec.action_high == (1.0,) * 5
    split = MultiAgentSplit(config, 1, [7])
    reference = simple_spread_v3.parallel_env(**config.kwargs)
    reference.reset(seed=7)
    actions = list(np.random.default_rng(1).uniform(0, 1, (3, 5)).astype(np.float32))
    result = split.step([actions]).results[0]
    obs, rewards, *_ = reference.step(dict(zip(reference.agents, actions, strict=True)))
    np.testing.assert_allclose(result.rewards, [rewards[a] for a in obs], rtol=1e-6)
    np.testing.assert_array_equal(result.next_obs[:, :18], np.stack(list(obs.values())))
    split.close()
