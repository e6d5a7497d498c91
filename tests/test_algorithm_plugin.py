"""The worked examples of algorithm plugins, each defined outside the package.

A2C, in this file: everything an algorithm that trains a built-in network needs is here:
its config dataclass (the `learner.a2c` section of an experiment, each field documented,
checked in `__post_init__`), its optimizer, its pure update, the network it trains (the
actor-critic, PPO's declaration), and one `register(...)` call that runs when the module
is imported. A2C (Mnih et al. 2016, synchronous): one gradient step per batch on the
policy-gradient loss with GAE advantages, without PPO's ratio clipping or epochs, plus a
value loss and an entropy bonus.

SAC, in `tests/plugin_sac.py`: an algorithm that brings its own network, its own
action-space rule and its own replay fields. An experiment names it in `plugins`, so the
launcher and every worker process import it before the config is checked; a real run
here shows it trains, and nothing in the package is edited.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml

from actors.envs import policy_spec
from learners.algorithms.ppo_config import ACTOR_CRITIC
from learners.algorithms.prepare import prepare
from learners.algorithms.sequences import episode_starts
from learners.algorithms.train_state import Batch, TrainState
from learners.models.networks import Policy, make_policy
from replay.buffer import ReplayBuffer
from srl_jax.config.loader import config_from_dict
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import (
    Algorithm,
    Replay,
    Sizes,
    algorithm,
    algorithm_config,
    check_inputs,
    register,
)
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.replay_spec import replay_fields, replay_layout
from srl_jax.launch import check_before_launch
from srl_jax.runtime.run_dir import read_status
from tests import plugin_sac
from tests.conftest import Processes, launch, read_metrics
from tests.update_checks import (
    SIZES,
    check_update_trains_and_repeats,
    check_value_loss_halves,
    random_batch,
    small_policy_state,
)


@dataclass
class A2CConfig:
    """A2C hyperparameters: the `learner.a2c` section of the experiment config."""

    learning_rate: float = 1e-3
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (1: Monte Carlo returns inside the chunk, bootstrapped at its end)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError("'learner.a2c.learning_rate' must be positive")
        if not 0 < self.gamma <= 1:
            raise ConfigError("'learner.a2c.gamma' must be in (0, 1]")
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError("'learner.a2c.gae_lambda' must be in [0, 1]")


def advantages_and_returns(batch: Batch, values: jax.Array, gamma: float,
                           lam: float) -> tuple[jax.Array, jax.Array]:
    """GAE over [T, B] steps from `values` [T+1, B]; an episode end stops the recursion
    (a truncated step bootstraps from the value of its final observation)."""
    next_values = jnp.where(batch.truncated > 0, batch.trunc_values, values[1:])
    deltas = batch.rewards + gamma * next_values * (1.0 - batch.terminated) - values[:-1]
    continues = 1.0 - jnp.maximum(batch.terminated, batch.truncated)

    def backward(carry: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple:
        delta, cont = step
        carry = delta + gamma * lam * cont * carry
        return carry, carry

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, continues),
                                 reverse=True)
    return advantages, advantages + values[:-1]


def a2c_loss(params: Any, policy: Policy, batch: Batch,
             config: A2CConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-log pi(a|s) * advantage + value loss - entropy bonus, with the current network
    (unrolled over each column from its stored state, should the policy be recurrent)."""
    T, B = batch.rewards.shape
    out, values, _ = policy.unroll(params, batch.obs, batch.state[0],
                                   episode_starts(batch.terminated, batch.truncated, T + 1))
    out = out[:T].reshape(T * B, *out.shape[2:])
    actions = batch.actions.reshape(T * B, *batch.actions.shape[2:])
    logp = policy.dist.log_prob(out, actions).reshape(T, B)
    entropy = policy.dist.entropy(out).mean()
    advantages, returns = advantages_and_returns(batch, jax.lax.stop_gradient(values),
                                                 config.gamma, config.gae_lambda)
    normalized = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -(logp * normalized).mean()
    value_loss = 0.5 * jnp.square(values[:-1] - returns).mean()
    loss = pg_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return loss, {"loss": loss, "pg_loss": pg_loss, "value_loss": value_loss,
                  "entropy": entropy, "advantage_mean": advantages.mean()}


def make_optimizer(config: A2CConfig, sizes: Sizes) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.adam(config.learning_rate, eps=1e-5))


def make_update(policy: Policy, optimizer: optax.GradientTransformation, config: A2CConfig,
                sizes: Sizes) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """One gradient step per batch: (state, batch) -> (state, metrics), pure."""

    def update(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        params, batch = prepare(state.params, batch, policy, sizes.reward_scale,
                                sizes.reward_clip)
        grads, metrics = jax.grad(
            lambda net: a2c_loss({**params, "net": net}, policy, batch, config),
            has_aux=True)(params["net"])
        updates, opt_state = optimizer.update(grads, state.opt_state, params["net"])
        net = optax.apply_updates(params["net"], updates)
        return TrainState({**params, "net": net}, opt_state, state.key, state.version + 1), metrics

    return update


ALGORITHM = Algorithm(
    name="a2c", config=A2CConfig, make_optimizer=make_optimizer, make_update=make_update,
    fields=("obs", "actions", "rewards", "terminated", "truncated", "trunc_values", "state"),
    networks=(ACTOR_CRITIC,))
register(ALGORITHM)


DEFAULTS = A2CConfig()


def fresh_state(config: A2CConfig = DEFAULTS) -> tuple:
    optimizer = make_optimizer(config, SIZES)
    policy, state = small_policy_state(optimizer)
    return policy, optimizer, state


def test_the_update_trains_and_lowers_the_value_loss() -> None:
    policy, optimizer, state = fresh_state()
    update = jax.jit(make_update(policy, optimizer, DEFAULTS, SIZES))
    check_update_trains_and_repeats(update, fresh_state, random_batch(),
                                    ("loss", "pg_loss", "value_loss", "entropy"))
    config = A2CConfig(learning_rate=3e-3, gamma=0.5)
    policy, optimizer, state = fresh_state(config)
    update = jax.jit(make_update(policy, optimizer, config, SIZES))
    check_value_loss_halves(update, state, random_batch(1), steps=30)


def test_the_registry_builds_the_section_from_the_experiment_config() -> None:
    assert algorithm("a2c") is ALGORITHM
    config = config_from_dict({"learner": {"algorithm": "a2c", "a2c": {"gamma": 0.9}}})
    assert algorithm_config(config) == A2CConfig(gamma=0.9)
    bad = config_from_dict({"learner": {"algorithm": "a2c", "a2c": {"gama": 0.9}}})
    with pytest.raises(ConfigError, match=r"'learner.a2c.gama' \(did you mean 'learner.a2c.gamma'"):
        algorithm_config(bad)
    with pytest.raises(ConfigError, match=r"'learner.a2c.gamma' must be in"):
        algorithm_config(config_from_dict({"learner": {"algorithm": "a2c", "a2c": {"gamma": 0}}}))


def test_an_algorithm_the_learner_cannot_feed_is_refused() -> None:
    reads_priorities = dataclasses.replace(ALGORITHM, name="a2c_prioritized",
                                           fields=(*ALGORITHM.fields, "priority"))
    with pytest.raises(ConfigError, match=r"reads fields \['priority'\] that the samples batch"):
        check_inputs(reads_priorities)
    from_replay = dataclasses.replace(ALGORITHM, name="a2c_replay",
                                      replay=Replay(window=lambda config: 3))
    with pytest.raises(ConfigError, match=r"reads fields \['state'\] that the replay batch"):
        check_inputs(from_replay)
    once_a_chunk = dataclasses.replace(from_replay, replay=Replay(lambda config: 3,
                                                                  fields=("state",)))
    with pytest.raises(ConfigError, match=r"keeps \['state'\] in replay: only chunk fields"):
        check_inputs(once_a_chunk)


def test_replay_keeps_the_chunk_fields_an_algorithm_asks_for_per_agent_column() -> None:
    """`Replay.fields`: a per-env field (the global state) serves every agent column of its
    env; each sampled row carries the kept fields at its first step."""
    T, envs, agents = 4, 3, 2
    spec = EnvSpec((2,), np.dtype(np.float32), 2, False, agents=agents, global_state_size=3)
    chunk = empty_chunk(T, envs * agents, spec)
    chunk["global_state"][:] = np.arange(chunk["global_state"].size).reshape(
        chunk["global_state"].shape)
    chunk["logp"][:] = -np.arange(chunk["logp"].size).reshape(chunk["logp"].shape)
    buffer = ReplayBuffer(64, T, envs * agents, spec, 1, 0.0, 0.0, seed=0,
                          kept=("global_state", "logp"))
    buffer.insert(chunk)
    batch = buffer.sample(50, 2)
    column, step = batch["slots"] // T, batch["slots"] % T
    np.testing.assert_array_equal(batch["global_state"],
                                  chunk["global_state"][step, column // agents])
    np.testing.assert_array_equal(batch["logp"], chunk["logp"][step, column])
    assert batch.keys() == replay_layout(50, 2, spec, replay_fields(False, ("global_state",
                                                                            "logp"))).keys()


SAC = {
    "name": "pendulum_sac",
    "seed": 1,
    "plugins": [plugin_sac.__name__],
    "env": {"id": "Pendulum-v1"},
    "actors": {"count": 1, "envs": 8, "splits": 1, "trajectory_length": 16,
               "inline_inference": True},
    "replay": {"count": 1, "capacity": 4096, "min_size": 256, "samples_per_insert": 4.0},
    "learner": {"algorithm": "sac", "batch_envs": 64, "publish_every_updates": 5,
                "sac": {"learning_rate": 1e-3}},
    "network": {"head": "sac", "hidden": [32, 32]},
    "checkpoint": {"enabled": False},
    "stop": {"env_frames": 2048, "wall_time_s": 300},
}
"""SAC on Pendulum-v1: its own network (`network.head: sac`), from replay."""


def sac_config(**sections: dict) -> Any:
    return config_from_dict({**SAC, **sections})


def test_a_plugin_network_is_the_one_its_algorithm_builds_and_its_rules_are_its_own() -> None:
    config = sac_config()
    policy, network = make_policy(config, policy_spec(config))
    assert isinstance(network, plugin_sac.SACNetwork) and policy.network is network
    assert algorithm_config(config) == plugin_sac.SACConfig(learning_rate=1e-3)
    with pytest.raises(ConfigError, match=r"^'network.head': 'sac' acts in continuous action "
                                          r"spaces; 'CartPole-v1' has discrete actions$"):
        check_before_launch(sac_config(env={"id": "CartPole-v1"}))
    with pytest.raises(ConfigError, match=r"^'network.head': 'sac' trains sac, not 'dueling'$"):
        algorithm_config(sac_config(network={"head": "dueling"}))
    with pytest.raises(ConfigError, match=r"^'network.head': 'dqn' trains dueling or q, not "
                                          r"'sac'$"):
        algorithm_config(sac_config(learner={"algorithm": "dqn", "batch_envs": 64}))
    with pytest.raises(ConfigError, match=r"^'network.layer_norm' is not read by 'network.head' "
                                          r"'sac'; leave it unset$"):
        algorithm_config(sac_config(network={"head": "sac", "layer_norm": True}))


@pytest.mark.slow
def test_a_plugin_with_its_own_network_and_replay_fields_trains_in_real_processes(
        processes: Processes, tmp_path: Path) -> None:
    path = tmp_path / "pendulum_sac.yaml"
    path.write_text(yaml.safe_dump(SAC))
    process, run_dir = launch(processes, tmp_path, experiment=str(path))
    assert process.wait(timeout=300) == 0, (tmp_path / "launch.log").read_text()
    final = read_status(run_dir)
    assert final["state"] == "finished" and "env frames reached" in final["stop_reason"], final
    rows = [row for row in read_metrics(run_dir) if row.get("learner_steps", 0) > 0]
    assert rows, "the learner updated"
    last = rows[-1]
    assert last["env_frames"] >= SAC["stop"]["env_frames"]
    for name in ("loss", "critic_loss", "actor_loss", "q_mean", "logp_drift"):
        assert math.isfinite(last[f"learner/{name}"]), name  # the plugin's own metrics
    assert last["learner/param_change"] > 0, "the update moved the plugin's network"
    assert last["replay/size"] > 0 and last["replay/samples_per_s"] > 0
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["network"]["head"] == "sac" and written["plugins"] == SAC["plugins"]
    assert written["learner"]["sac"] == {**vars(plugin_sac.SACConfig()), "learning_rate": 1e-3}
    assert "sac on" in (run_dir / "logs" / "learner-0.log").read_text()
