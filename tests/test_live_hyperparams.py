"""Live hyperparameters (`Algorithm.live`, `TrainState.hyper`): changed on a built Learner,
they take effect at the next update without recompiling it, and are checkpointed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actors.envs import policy_spec
from learners.algorithms.dqn_config import ALGORITHM as DQN
from learners.algorithms.impala_config import ALGORITHM as IMPALA
from learners.algorithms.ppo_config import ALGORITHM as PPO
from learners.training.checkpoint import Checkpointer
from learners.training.learner import Learner, build_learner
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import Algorithm, algorithm_config, live_values
from tests.conftest import REPO, make_config
from tests.test_learner import B, T, random_batch
from tests.update_checks import SIZES, small_policy_state
from tests.update_checks import random_batch as small_batch

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def config_for(algorithm: str) -> ExperimentConfig:
    """The default experiment with `algorithm` (DQN: the CartPole DQN one), on B columns."""
    if algorithm == "dqn":
        return load_config(REPO / "configs" / "cartpole_dqn.yaml", [f"learner.batch_envs={B}"])
    return make_config([f"actors.trajectory_length={T}", f"learner.batch_envs={B}",
                        "actors.envs=4", "actors.splits=1", f"learner.algorithm={algorithm}"])


def build(algorithm: str = "ppo", checkpointer: Checkpointer | None = None) -> Learner:
    """The Learner of `config_for(algorithm)`, as the worker builds it."""
    config = config_for(algorithm)
    return build_learner(config, policy_spec(config, "default"), B, checkpointer)


def batch_for(learner: Learner) -> dict[str, np.ndarray]:
    """A trajectory batch, or for a replay learner B sampled one-step transitions."""
    if "next_obs" not in learner.inputs.example:
        return random_batch()
    rng = np.random.default_rng(0)
    batch = {name: np.zeros_like(a) for name, a in learner.inputs.example.items()}
    batch["obs"][:] = rng.normal(size=batch["obs"].shape)
    batch["next_obs"][:] = rng.normal(size=batch["next_obs"].shape)
    batch["actions"][:] = rng.integers(0, 2, B)
    batch["rewards"][:, 0] = 1.0
    batch["steps"][:] = 1
    batch["weights"][:] = 1.0
    return batch


def net(learner: Learner) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(learner.params["net"])]


def moved(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    return any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@contextmanager
def compilations() -> Iterator[list[str]]:
    """The XLA compilations made inside the block (one entry each)."""
    seen: list[str] = []

    def listen(event: str, _seconds: float, **_: object) -> None:
        if event == COMPILE_EVENT:
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture(scope="module")
def learner() -> Learner:
    return build()


def test_it_starts_from_the_config_values(learner: Learner):
    expected = live_values(PPO, algorithm_config(config_for("ppo")))
    assert set(expected) == set(PPO.live)
    assert learner.hyperparams() == {name: float(np.float32(v)) for name, v in expected.items()}


def test_a_new_step_size_takes_effect_at_the_next_update_without_recompiling(learner: Learner):
    learner.step(random_batch())  # anything a first step compiles besides the update
    compiled = learner._update
    with compilations() as compiled_now:
        learner.set_hyperparams({"learning_rate": 0.0})
        before = net(learner)
        learner.step(random_batch(1))
        assert not moved(before, net(learner)), "a step size of 0 leaves the network as it is"
        learner.set_hyperparams({"learning_rate": 1e-3})
        learner.step(random_batch(2))
        assert moved(before, net(learner))
        jax.jit(lambda x: x * 3)(1.0)  # a probe: compilations are heard
    assert learner._update is compiled and len(compiled_now) == 1, "only the probe compiled"
    assert learner.hyperparams()["learning_rate"] == float(np.float32(1e-3))


def test_the_entropy_weight_changes_the_loss_by_its_share(learner: Learner):
    learner.set_hyperparams({"learning_rate": 0.0, "ent_coef": 0.0})
    start = jax.tree.map(jnp.copy, learner.state)
    without = learner.step(random_batch(3))
    learner.state = start  # the same state again (the update donated the other one)
    learner.set_hyperparams({"ent_coef": 0.5})
    with_bonus = learner.step(random_batch(3))
    assert with_bonus["entropy"] == without["entropy"] > 0
    assert with_bonus["loss"] == pytest.approx(without["loss"] - 0.5 * without["entropy"],
                                               rel=1e-5)


def test_an_unknown_or_non_finite_value_is_refused_with_one_line(learner: Learner):
    before = learner.hyperparams()
    with pytest.raises(ValueError) as refused:
        learner.set_hyperparams({"gamma": 0.9, "ent_coef": 0.1})
    message = str(refused.value)
    assert "\n" not in message and "gamma" in message
    assert all(name in message for name in PPO.live)
    with pytest.raises(ValueError, match="finite: learning_rate"):
        learner.set_hyperparams({"learning_rate": float("nan")})
    assert learner.hyperparams() == before, "a refused change changes nothing"


def test_the_values_are_checkpointed_with_the_state(tmp_path: Path):
    trained = build(checkpointer=Checkpointer(tmp_path, async_save=False))
    values = {"learning_rate": 5e-4, "ent_coef": 0.03, "vf_coef": 0.25, "clip_coef": 0.1}
    trained.set_hyperparams(values)
    trained.step(random_batch())
    trained.save({})
    trained.checkpointer.close()

    fresh = build(checkpointer=Checkpointer(tmp_path, async_save=False))
    assert fresh.hyperparams() != trained.hyperparams()
    fresh.restore()
    assert fresh.hyperparams() == {name: float(np.float32(v)) for name, v in values.items()}
    fresh.step(random_batch(1))  # the restored values fit the compiled update
    fresh.checkpointer.close()


@pytest.mark.parametrize("algorithm", [DQN, IMPALA], ids=["dqn", "impala"])
def test_dqn_and_impala_take_a_new_step_size(algorithm):
    learner = build(algorithm.name)
    assert set(learner.hyperparams()) == set(algorithm.live)
    batch = batch_for(learner)
    learner.set_hyperparams({"learning_rate": 0.0})
    before = net(learner)
    learner.step(batch)
    assert not moved(before, net(learner))
    learner.set_hyperparams({"learning_rate": 1e-3})
    learner.step(batch)
    assert moved(before, net(learner))


@pytest.mark.parametrize("algorithm", [PPO, IMPALA], ids=["ppo", "impala"])
def test_values_in_the_state_update_exactly_as_the_same_values_in_the_config(
        algorithm: Algorithm):
    """Traced step size and weights give the numbers the config's constants give, bit for
    bit: the step size is applied as optax.adam applied it."""
    config = algorithm.config(learning_rate=1e-3, ent_coef=0.02)
    optimizer = algorithm.make_optimizer(config, SIZES)
    policy, constant = small_policy_state(optimizer)
    traced = constant._replace(hyper=jax.tree.map(
        lambda v: jnp.asarray(v, jnp.float32), live_values(algorithm, config)))
    update = jax.jit(algorithm.make_update(policy, optimizer, config, SIZES))
    for seed in range(2):
        constant, by_config = update(constant, small_batch(seed))
        traced, by_state = update(traced, small_batch(seed))
        assert jax.device_get(by_config) == jax.device_get(by_state)
    for a, b in zip(jax.tree.leaves(constant.params), jax.tree.leaves(traced.params),
                    strict=True):
        np.testing.assert_array_equal(a, b)
