"""The worked example of an algorithm plugin: A2C, defined in this file only.

Everything an algorithm needs is here: its config dataclass (the `learner.a2c`
section of an experiment, each field documented, checked in `__post_init__`),
its optimizer, its pure update, and one `register(...)` call that runs when the
module is imported. An experiment names the module in `plugins`, so the launcher
and every worker process import it before the config is checked; nothing in the
package is edited. A2C (Mnih et al. 2016, synchronous): one gradient step per
batch on the policy-gradient loss with GAE advantages, without PPO's ratio
clipping or epochs, plus a value loss and an entropy bonus.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
import yaml

from learners.algorithms.prepare import prepare
from learners.algorithms.sequences import episode_starts
from learners.algorithms.train_state import Batch, TrainState
from learners.models.networks import Policy
from srl_jax.config.loader import config_from_dict
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import (
    Algorithm,
    Sizes,
    algorithm,
    algorithm_config,
    check_inputs,
    register,
)
from srl_jax.runtime.run_dir import read_status
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
    fields=("obs", "actions", "rewards", "terminated", "truncated", "trunc_values", "state"))
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
    from_nowhere = dataclasses.replace(ALGORITHM, name="a2c_nowhere", source="disk")
    with pytest.raises(ConfigError, match="takes its data from 'disk'"):
        check_inputs(from_nowhere)
    from_replay = dataclasses.replace(ALGORITHM, name="a2c_replay", source="replay")
    with pytest.raises(ConfigError, match="needs a replay_window exactly when"):
        check_inputs(from_replay)
    windowed = dataclasses.replace(from_replay, replay_window=lambda config: 3)
    with pytest.raises(ConfigError, match=r"reads fields \['state'\] that the replay batch"):
        check_inputs(windowed)


EXPERIMENT = {
    "name": "cartpole_a2c",
    "seed": 1,
    "plugins": [__name__],
    "env": {"id": "CartPole-v1"},
    "actors": {"count": 2, "envs": 32, "splits": 2, "trajectory_length": 16},
    "inference": {"count": 1, "max_batch": 32},
    "learner": {"algorithm": "a2c", "batch_envs": 32, "staleness_cap": 2,
                "a2c": {"learning_rate": 2e-3, "ent_coef": 0.0, "gae_lambda": 0.95}},
    "network": {"hidden": [64, 64]},
    "checkpoint": {"enabled": False},
    "stop": {"target_return": 200, "wall_time_s": 600},
}


@pytest.mark.slow
def test_a2c_plugin_solves_cartpole_in_real_processes(processes: Processes,
                                                      tmp_path: Path) -> None:
    path = tmp_path / "cartpole_a2c.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    process, run_dir = launch(processes, tmp_path, experiment=str(path))
    assert process.wait(timeout=700) == 0, (tmp_path / "launch.log").read_text()
    final = read_status(run_dir)
    assert final["state"] == "finished" and "reached the target" in final["stop_reason"]
    assert max(r.get("episode_return_mean", 0) for r in read_metrics(run_dir)) >= 200
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["plugins"] == [__name__]
    assert written["learner"]["a2c"] == {**vars(DEFAULTS), **EXPERIMENT["learner"]["a2c"]}
    assert "a2c on" in (run_dir / "logs" / "learner-0.log").read_text()
