"""Ape-X DQN's math and update on arrays: n-step targets, the Q heads, the target network
and the priorities it sends back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actors.envs import policy_spec
from learners.algorithms.dqn import nstep_targets
from learners.models.distributions import GREEDY
from learners.models.networks import QNetwork, make_policy
from learners.training.learner import build_learner
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.launch import check_before_launch
from tests.conftest import REPO


def dqn_config(overrides: list[str] = ()) -> ExperimentConfig:
    return load_config(REPO / "configs" / "cartpole_dqn.yaml", overrides)


def test_nstep_targets_discount_and_cut_at_episode_ends() -> None:
    rewards = jnp.array([[1.0, 2.0, 4.0], [1.0, 2.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    steps = jnp.array([3, 2, 1, 3])
    terminated = jnp.array([0.0, 1.0, 0.0, 0.0])
    truncated = jnp.array([0.0, 0.0, 1.0, 0.0])
    trunc_values = jnp.array([0.0, 0.0, 8.0, 0.0])
    next_values = jnp.array([10.0, 10.0, 10.0, 10.0])
    g = 0.5
    expected = [1 + g * 2 + g**2 * 4 + g**3 * 10,  # full window, bootstrap from the target
                1 + g * 2,                         # terminated after 2 steps: no bootstrap
                1 + g * 8,                         # cut by a time limit: its stored value
                1 + g + g**2 + g**3 * 10]
    np.testing.assert_allclose(nstep_targets(rewards, steps, terminated, truncated,
                                             trunc_values, next_values, g), expected, rtol=1e-6)


def test_dueling_q_network_and_greedy_policy() -> None:
    net = QNetwork(3, hidden=(8,), dueling=True)
    params = net.init(jax.random.key(0), jnp.zeros((1, 4)))
    obs = jax.random.normal(jax.random.key(1), (5, 4))
    q, value = net.apply(params, obs)
    assert q.shape == (5, 3)
    np.testing.assert_allclose(value, q.max(-1))
    actions = GREEDY.sample(jax.random.key(2), q)
    np.testing.assert_array_equal(actions, np.argmax(q, -1))
    assert float(jnp.abs(GREEDY.log_prob(q, actions)).max()) == 0.0


@pytest.mark.parametrize(("overrides", "message"), [
    (["network.head=actor_critic"], "'dqn' trains dueling or q, not 'actor_critic'"),
    (["replay.count=0"], "'dqn' learns from replay; it needs at least 1 replay server"),
    (["network.core=lstm"], "'network.core': 'dqn' replays n-step transitions"),
    (["learner.dqn.n_step=17"], "'learner.dqn.n_step' (17) must not exceed"),
    (["actors.epsilon=1.5"], "'actors.epsilon'"),
])
def test_bad_dqn_configs_are_refused_with_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_before_launch(dqn_config(overrides))


def test_updates_fit_the_targets_copy_the_target_network_and_return_priorities() -> None:
    config = dqn_config(["learner.batch_envs=32", "learner.dqn.target_update_period=3",
                         "learner.dqn.learning_rate=0.002"])
    spec = policy_spec(config, "default")
    learner = build_learner(config, spec, local_envs=32)
    rng = np.random.default_rng(0)
    batch = {name: np.zeros_like(a) for name, a in learner.inputs.example.items()}
    batch["obs"][:] = rng.normal(size=batch["obs"].shape)
    batch["next_obs"][:] = rng.normal(size=batch["next_obs"].shape)
    batch["actions"][:] = rng.integers(0, 2, 32)
    batch["rewards"][:, 0] = 1.0
    batch["steps"][:] = 1
    batch["terminated"][:] = 1.0  # targets are the rewards: a fixed regression
    batch["weights"][:] = 1.0
    policy, _ = make_policy(config, spec)
    initial_target = jax.tree.map(np.asarray, learner.state.extra["target"])
    losses, priorities = [], None
    for _ in range(200):
        metrics = learner.step(batch)
        losses.append(metrics["loss"])
        priorities = metrics["priorities"]
        if learner.version == 2:
            assert all(np.array_equal(a, b) for a, b in zip(
                jax.tree.leaves(initial_target),
                jax.tree.leaves(jax.tree.map(np.asarray, learner.state.extra["target"])),
                strict=True)), "the target network waits for target_update_period"
        if learner.version == 3:
            same = jax.tree.map(np.array_equal, jax.tree.map(np.asarray, learner.state.params),
                                jax.tree.map(np.asarray, learner.state.extra["target"]))
            assert all(jax.tree.leaves(same)), "copied on the third update"
    assert losses[-1] < 0.1 * losses[0]
    learner.step(learner.put(batch))  # a put batch (on one CPU device: the host arrays)
    assert priorities.shape == (32,) and np.all(priorities > 0)
    q, _, _ = policy.apply(learner.state.params, batch["obs"], np.zeros((32, 0), np.float32))
    np.testing.assert_allclose(np.asarray(q)[np.arange(32), batch["actions"]], 1.0, atol=0.2)


def test_chunks_carry_final_observations_only_for_a_replay_of_transitions() -> None:
    from actors.envs import policy_spec
    assert policy_spec(dqn_config()).final_obs, "DQN on CartPole: the target network values them"
    for name in ("cartpole_ppo", "cartpole_r2d2"):  # a critic's value, a sequence's trunc_values
        assert not policy_spec(load_config(REPO / "configs" / f"{name}.yaml")).final_obs
