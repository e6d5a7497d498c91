"""MuZero on the dataflow, without processes: the config's refusals, the servers' acting
call and its replies, the replay's search targets and their reanalysis with new
parameters. The run itself (servers killed mid-run) is tests/test_muzero_run.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from actors.envs import policy_spec
from learners.algorithms.muzero.search import model_fns, search
from learners.models.networks import init_policy_params, make_policy
from learners.models.param_codec import params_to_arrays
from policy.acting import make_runner
from policy.export import TrainedPolicy
from replay.position_buffer import PositionBuffer
from replay.reanalysing_replay import reanalyse
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.replay_spec import replay_layout
from srl_jax.launch import check_before_launch
from tests.conftest import REPO, make_config

T, WINDOW = 8, 4
SMALL = (f"actors.trajectory_length={T}", "learner.muzero.unroll_steps=2",
         "learner.muzero.n_step=2", "learner.muzero.simulations=4", "learner.muzero.latent=8",
         "network.hidden=[16]")


def muzero_config(*overrides: str):
    return make_config([*SMALL, *overrides], "cartpole_muzero")


@pytest.mark.parametrize(("overrides", "error"), [
    (("learner.algorithm=ppo",), "'network.head': 'ppo' trains actor_critic, not 'muzero'"),
    (("network.head=actor_critic",), "'network.head': 'muzero' trains muzero"),
    (("learner.normalize_obs=true",), "reads observations as they are"),
    (("network.core=lstm",), "learns its own dynamics"),
    (("learner.muzero.reanalyse_fraction=1.5",), "reanalyse_fraction' must be in"),
    (("learner.muzero.unroll_steps=7",), "'actors.trajectory_length' \\(8\\) must exceed the "
                                         "steps each chunk repeats"),
])
def test_a_muzero_config_that_cannot_run_is_refused_in_one_line(overrides, error) -> None:
    with pytest.raises(ConfigError, match=error):
        check_before_launch(load_config(REPO / "configs" / "cartpole_muzero.yaml",
                                        [*SMALL, *overrides]))


@pytest.mark.slow  # compiles searches: seconds each on a cold cache
def test_the_servers_search_and_reply_with_the_search_policy_and_its_depth() -> None:
    config = muzero_config()
    spec = policy_spec(config)
    assert spec.search_policy and not spec.action_values
    runner = make_runner(config, spec, 0, 4, 4)
    out, version = runner.run(np.zeros((3, 4), np.float32), runner.zero_state(3))
    assert version == 0 and set(out) == {"action", "logp", "value", "search_policy",
                                         "search_depth"}
    np.testing.assert_allclose(out["search_policy"].sum(1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.exp(out["logp"]),
                               out["search_policy"][np.arange(3), out["action"]], rtol=1e-5)
    assert ((out["search_depth"] >= 1) & (out["search_depth"] <= 4)).all()


def stored_positions(spec, columns: int) -> PositionBuffer:
    buffer = PositionBuffer(100, T, columns, spec, 1, 1.0, 0.5, seed=0,
                            kept=("action_mask",), positions=T - WINDOW + 1, window=WINDOW)
    chunk = empty_chunk(T, columns, spec)
    chunk["obs"] = np.random.default_rng(0).normal(size=chunk["obs"].shape).astype(np.float32)
    chunk["values"][:] = 7.0
    chunk["search_policy"][:] = [1.0, 0.0]
    buffer.insert(chunk)
    return buffer


@pytest.mark.slow  # compiles searches: seconds each on a cold cache
def test_reanalysis_searches_with_the_newest_parameters_and_renews_what_is_stored() -> None:
    config = muzero_config()
    spec = policy_spec(config)
    buffer = stored_positions(spec, columns=2)
    batch = buffer.sample(2, WINDOW)
    assert batch.keys() == replay_layout(2, WINDOW, spec, buffer.fields).keys()
    np.testing.assert_array_equal(batch["search_policy"][..., 0], 1.0)

    runner = make_runner(config, spec, 0, WINDOW, 2 * WINDOW, explore=False)
    obs = batch["obs"][:, :WINDOW]
    first = reanalyse(runner, obs)
    policy, network = make_policy(config, spec)
    initial = init_policy_params(network, spec.obs_shape, seed=0)
    keys = iter(jax.random.split(jax.random.key(7), 64))
    newer = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), initial)
    runner.set_params(params_to_arrays(newer), version=3)
    policies = reanalyse(runner, obs)
    assert policies.shape == (2, WINDOW, 2)
    assert not np.allclose(policies, first), "the newest parameters, not version 0's"
    settings = algorithm_config(config)
    expected = jax.jit(lambda net, obs: search(
        model_fns(policy.network), net, obs, jax.random.key(0), settings.simulations,
        settings.gamma, settings.considered_actions, gumbel_scale=0.0))(
        newer["net"], obs.reshape(2 * WINDOW, 4))
    np.testing.assert_allclose(policies, np.asarray(expected.policy).reshape(2, WINDOW, 2),
                               rtol=1e-4, atol=1e-5)
    # Only legal actions where the env masks them: the search's policy gives the rest 0.
    legal = np.ones((2, WINDOW, 2), bool)
    legal[:, :, 0] = False
    np.testing.assert_allclose(reanalyse(runner, obs, legal)[..., 0], 0.0, atol=1e-6)

    # Stored: the next sample of those positions carries the renewed targets ...
    assert buffer.refresh(batch["slots"], batch["generations"], policies) == 2
    again = buffer.sample(2, WINDOW)
    for row, slot in enumerate(again["slots"]):
        source = list(batch["slots"]).index(slot) if slot in batch["slots"] else None
        if source is not None:
            np.testing.assert_allclose(again["search_policy"][row], policies[source])
    # ... but a sequence overwritten since it was sampled keeps its successor's.
    assert buffer.refresh(batch["slots"], batch["generations"] - 1, policies * 0) == 0


@pytest.mark.slow  # compiles searches: seconds each on a cold cache
def test_an_evaluated_or_loaded_muzero_policy_acts_by_its_search_without_sampling() -> None:
    config = muzero_config()
    spec = policy_spec(config)
    runner = make_runner(config, spec, 0, 8, 8, explore=False)
    policy, _ = make_policy(config, spec)
    trained = TrainedPolicy(config, spec, policy, runner.params, step=0)
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    searched, _ = runner.run(obs, runner.zero_state(8))
    np.testing.assert_array_equal(trained.act_batch(obs), searched["action"])
