"""The socket-free Learner: built from its parts, stepped on host arrays, saved and restored."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from actors.envs import env_spec
from learners.models.networks import init_policy_params, make_policy
from learners.training.checkpoint import Checkpointer
from learners.training.learner import Learner, chunk_inputs, init_arguments, train_state_init
from learners.training.mesh import make_learner_mesh
from srl_jax.dataflow.algorithms import algorithm, algorithm_config, live_values, sizes
from srl_jax.dataflow.chunk_spec import empty_chunk, run_chunk_layout
from tests.conftest import make_config

T, B = 8, 4


def build(checkpointer: Checkpointer | None = None, seed: int = 0) -> Learner:
    config = make_config([f"actors.trajectory_length={T}", f"learner.batch_envs={B}",
                          "actors.envs=4", "actors.splits=1", f"seed={seed}"])
    spec = env_spec(config.env)
    policy, network = make_policy(config, spec)
    algo, algo_config, derived = algorithm("ppo"), algorithm_config(config), sizes(config)
    optimizer = algo.make_optimizer(algo_config, derived)
    return Learner(spec, network, optimizer,
                   algo.make_update(policy, optimizer, algo_config, derived),
                   make_learner_mesh(1, B), chunk_inputs(T, B, spec), config.seed, checkpointer,
                   hyper=live_values(algo, algo_config))


def random_batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    spec = env_spec(make_config().env)
    arrays = empty_chunk(T, B, spec)
    arrays["obs"][:] = rng.normal(size=arrays["obs"].shape)
    arrays["actions"][:] = rng.integers(0, 2, arrays["actions"].shape)
    arrays["logp"][:] = np.log(0.5)
    arrays["rewards"][:] = 1.0
    arrays["terminated"][:] = rng.random((T, B)) < 0.1
    return arrays


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype,
                                                                       jax.dtypes.prng_key)
                       else x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def learner() -> Learner:
    return build()


def test_the_batch_it_compiles_for_is_the_chunk_layout_on_b_columns():
    config = make_config([f"actors.trajectory_length={T}", "actors.envs=4", "actors.splits=1"])
    layout = run_chunk_layout(config, env_spec(config.env))
    assert layout["obs"][0] == (T + 1, B, 4)


def test_the_initial_state_program_is_the_same_for_every_seed_and_starting_value():
    """A seed or a starting hyperparameter baked into the program would miss the
    compilation cache on every new seed; as arguments they give the int seed's keys."""
    config = make_config()
    spec = env_spec(config.env)
    _, network = make_policy(config, spec)
    init = jax.jit(train_state_init(spec, network, optax.adam(1e-3), None))
    programs = {init.lower(*init_arguments(seed, {"learning_rate": lr})).as_text()
                for seed, lr in [(1, 1e-3), (2**32 + 7, 3e-4)]}
    assert len(programs) == 1
    state = init(*init_arguments(2**32 + 5, {"learning_rate": 3e-4}))
    expected = init_policy_params(network, spec.obs_shape, 5)
    for ours, theirs in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected),
                            strict=True):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(jax.random.key_data(state.key),
                                  jax.random.key_data(jax.random.key(6)))
    assert float(state.hyper["learning_rate"]) == np.float32(3e-4)


def test_step_trains_and_counts_versions(learner: Learner):
    before = leaves(learner.params)
    metrics = learner.step(random_batch())
    assert learner.version == 1
    assert metrics and all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())
    assert any(not np.array_equal(a, b) for a, b in zip(before, leaves(learner.params),
                                                        strict=True))
    ran = []
    learner.step(learner.put(random_batch(1)), overlap=lambda: ran.append(learner.version))
    assert ran == [1] and learner.version == 2, "overlap runs before the update counts"


def test_save_and_restore_roundtrip(tmp_path):
    trained = build(Checkpointer(tmp_path, async_save=False))
    trained.step(random_batch())
    trained.step(random_batch(1))
    assert trained.save({"note": "hello"}) >= 0.0
    trained.checkpointer.close()

    fresh = build(Checkpointer(tmp_path, async_save=False), seed=1)
    assert fresh.version == 0
    assert fresh.restore() == {"note": "hello"}
    assert fresh.version == 2
    for a, b in zip(leaves(trained.state), leaves(fresh.state), strict=True):
        np.testing.assert_array_equal(a, b)
    fresh.step(random_batch(2))  # the restored state still fits the compiled update
    assert fresh.version == 3
    fresh.checkpointer.close()


def test_without_a_checkpointer_there_is_nothing_to_restore(learner: Learner):
    assert learner.restore() is None
    with pytest.raises(ValueError, match="checkpointer"):
        learner.save({})
