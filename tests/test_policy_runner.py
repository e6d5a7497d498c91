"""The policy runner on arrays: padded sizes, outputs per spec, parameter versions."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from learners.models.networks import init_policy_params, make_policy
from learners.models.outputs import pack_outputs, unpack_outputs
from learners.models.param_codec import params_to_arrays
from policy.acting import make_runner
from policy.policy_runner import PolicyRunner, padded_sizes
from srl_jax.dataflow.env_spec import EnvSpec, with_network
from tests.conftest import make_config

DISCRETE = EnvSpec((4,), np.dtype(np.float32), 2, continuous=False)
CONTINUOUS = EnvSpec((3,), np.dtype(np.float32), 2, continuous=True, action_low=(-1.0, -1.0),
                     action_high=(1.0, 1.0))


def runner_for(spec: EnvSpec, min_size: int = 1, max_size: int = 8) -> PolicyRunner:
    return make_runner(make_config(), spec, sampling_seed=0, min_size=min_size,
                       max_size=max_size)


def observations(rows: int, spec: EnvSpec) -> np.ndarray:
    rng = np.random.default_rng(rows)
    return rng.uniform(-0.5, 0.5, (rows, *spec.obs_shape)).astype(spec.obs_dtype)


def test_q_values_and_the_search_policy_come_back_each_in_its_own_output() -> None:
    rows, action = 3, np.array([1, 0, 2])
    logp, value = np.full(rows, -0.5), np.arange(rows, dtype=np.float32)
    q, searched = np.arange(9.0).reshape(3, 3), np.full((rows, 3), 1 / 3)
    state, depth = np.ones((rows, 2)), np.array([4, 5, 6])
    spec = EnvSpec((4,), np.dtype(np.float32), 3, continuous=False, state_size=2,
                   action_values=True, search_policy=True)
    out = unpack_outputs(pack_outputs(action, logp, value, state, np, q=q,
                                      search_policy=searched, search_depth=depth), spec)
    np.testing.assert_array_equal(out["action"], action)
    np.testing.assert_array_equal(out["state"], state)
    np.testing.assert_array_equal(out["q"], q)
    np.testing.assert_allclose(out["search_policy"], searched)
    np.testing.assert_array_equal(out["search_depth"], depth)


def test_padded_sizes_are_powers_of_two_up_to_the_first_that_holds_the_batch() -> None:
    assert padded_sizes(1, 1) == [1]
    assert padded_sizes(3, 20) == [4, 8, 16, 32]
    assert padded_sizes(8, 64) == [8, 16, 32, 64]
    runner = runner_for(DISCRETE, min_size=3, max_size=20)
    assert runner.sizes == (4, 8, 16, 32)
    assert [runner.padded_size(rows) for rows in (1, 4, 5, 17, 32)] == [4, 4, 8, 32, 32]
    assert runner.padded_size(33) == 64 and runner.padded_size(129) == 256


def test_compile_runs_every_padded_size_once() -> None:
    runner = runner_for(DISCRETE, max_size=8)
    runner.compile()
    assert runner.calls == len(runner.sizes) == 4


@pytest.mark.parametrize(("rows", "core"), [(1, "none"), (3, "none"), (8, "none"),
                                            (11, "none"), (3, "lstm"), (11, "gru")])
def test_discrete_outputs_match_the_policy_for_every_row(rows: int, core: str) -> None:
    """Padding rows change nothing; a recurrent policy acts from the state given for each
    row and answers with the next one."""
    config = make_config([f"network.core={core}", "network.core_size=8"])
    spec = with_network(DISCRETE, config.network)
    runner = make_runner(config, spec, sampling_seed=0, min_size=1, max_size=8)
    obs = observations(rows, spec)
    state = np.random.default_rng(rows).normal(size=(rows, spec.state_size)).astype(np.float32)
    outputs, version = runner.run(obs, state)
    names = {"action", "logp", "value"} | ({"state"} if core != "none" else set())
    assert version == 0 and set(outputs) == names
    action, logp, value = outputs["action"], outputs["logp"], outputs["value"]
    assert action.shape == (rows,) and action.dtype == np.int32
    assert set(action.tolist()) <= {0, 1}
    assert logp.shape == (rows,) and value.shape == (rows,)
    policy, _ = make_policy(config, spec)
    logits, values, new_state = policy.apply(runner.params, obs, state)
    table = np.asarray(jax.nn.log_softmax(logits))
    np.testing.assert_allclose(logp, table[np.arange(rows), action], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, np.asarray(values), rtol=1e-5, atol=1e-6)
    if core != "none":
        assert outputs["state"].shape == (rows, spec.state_size)
        np.testing.assert_allclose(outputs["state"], new_state, rtol=1e-5, atol=1e-6)
        assert not np.allclose(outputs["state"], state)


def test_continuous_outputs_have_an_action_vector_per_row() -> None:
    runner = runner_for(CONTINUOUS)
    outputs, _ = runner.run(observations(5, CONTINUOUS), runner.zero_state(5))
    assert outputs["action"].shape == (5, 2) and outputs["action"].dtype == np.float32
    assert outputs["logp"].shape == (5,) and outputs["value"].shape == (5,)
    assert np.all(np.isfinite(outputs["logp"]))


def test_set_params_changes_outputs_and_version_and_refuses_a_misfit() -> None:
    runner = runner_for(DISCRETE)
    obs, state = observations(6, DISCRETE), runner.zero_state(6)
    before, _ = runner.run(obs, state)
    _, network = make_policy(make_config(), DISCRETE)
    newer = params_to_arrays(init_policy_params(network, DISCRETE.obs_shape, seed=99))
    runner.set_params(newer, version=7, started_ms=2)
    after, version = runner.run(obs, state)
    assert version == 7 and runner.started_ms == 2 and runner.updates == 1
    assert not np.allclose(after["value"], before["value"])

    misfit = dict(newer)
    misfit.pop(next(iter(misfit)))
    with pytest.raises(ValueError, match="arrays for"):
        runner.set_params(misfit, version=8)
    assert runner.run(obs, state)[1] == 7 and runner.updates == 1


def test_a_runner_of_the_parameters_shapes_compiles_ahead_and_acts_once_it_takes_them() -> None:
    """An inference server's runner: nothing initialised, every padded size compiled against
    the shapes, nothing traced or compiled again once the learner's parameters come."""
    seeded = runner_for(DISCRETE)
    runner = make_runner(make_config(), DISCRETE, sampling_seed=0, min_size=1, max_size=8,
                         published=True)
    assert seeded.ready and not runner.ready
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(runner.params))
    runner.compile()
    assert runner.calls == 0, "compiled without acting"
    obs = {rows: observations(rows, DISCRETE) for rows in (1, 2, 3, 8)}
    expected = {rows: seeded.run(o, seeded.zero_state(rows))[0]["value"] for rows, o in obs.items()}
    runner.set_params(params_to_arrays(seeded.params), version=0, started_ms=3)
    assert runner.ready and (runner.version, runner.updates) == (0, 1)
    seen: list[str] = []

    def listen(event: str, _seconds: float, **_: object) -> None:
        if event.startswith("/jax/core/compile/"):
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        values = {rows: runner.run(o, runner.zero_state(rows))[0]["value"]
                  for rows, o in obs.items()}
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert not seen, f"compiled again on the first calls: {seen}"
    for rows, value in values.items():
        np.testing.assert_allclose(value, expected[rows], rtol=1e-6, atol=1e-6)
