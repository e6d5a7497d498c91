"""Population-based training's pure parts: draws, start values, ranking, explore, sweeps."""

from __future__ import annotations

import re

import numpy as np
import pytest

from srl_jax.config.population import (
    MemberView,
    check_population,
    decide,
    explore,
    initial_hyperparams,
    member_score,
    ranked_version,
    ranking_metric,
    sweep_overrides,
)
from srl_jax.config.schema import ConfigError, PopulationConfig
from srl_jax.dataflow.worker_kinds import worker_plan
from tests.conftest import make_config

LR = "learner.ppo.learning_rate"
PPO_LIVE = ("learning_rate", "ent_coef", "vf_coef", "clip_coef")


def population(*overrides: str):
    return make_config(["population.members=4", *overrides])


def test_members_start_from_their_own_draws_or_listed_values() -> None:
    config = population(f"population.explore={{{LR}: {{log_uniform: [1.0e-4, 1.0e-2]}}, "
                        "learner.ppo.ent_coef: [0.0, 0.01]}",
                        f"population.initial={{{LR}: [1.0e-3, 1.0e-3, 1.0e-7, 1.0e-7]}}")
    check_population(config, PPO_LIVE)
    start = initial_hyperparams(config)
    assert list(start) == ["m0", "m1", "m2", "m3"]
    assert [values[LR] for values in start.values()] == [1e-3, 1e-3, 1e-7, 1e-7]
    assert all(values["learner.ppo.ent_coef"] in (0.0, 0.01) for values in start.values())
    assert start == initial_hyperparams(config), "the draws are reproducible"
    drawn = initial_hyperparams(population(
        f"population.explore={{{LR}: {{log_uniform: [1.0e-4, 1.0e-2]}}}}"))
    assert all(1e-4 <= values[LR] <= 1e-2 for values in drawn.values())
    assert len({values[LR] for values in drawn.values()}) == 4


def test_explore_perturbs_or_redraws() -> None:
    pop = PopulationConfig(members=4, explore={LR: {"uniform": [0.5, 1.5]}},
                           resample_probability=0.0)
    rng = np.random.default_rng(0)
    new = [explore({LR: 1.0, "learner.ppo.ent_coef": 0.01}, pop, rng) for _ in range(20)]
    assert {round(v[LR], 6) for v in new} == {0.8, 1.2}
    assert all(v["learner.ppo.ent_coef"] == 0.01 for v in new), "not explored: kept"
    pop.resample_probability = 1.0
    assert all(0.5 <= explore({LR: 1.0}, pop, rng)[LR] <= 1.5 for _ in range(20))


def test_explore_stays_inside_the_declared_ranges_and_leaves_zero() -> None:
    ENT = "learner.ppo.ent_coef"
    pop = PopulationConfig(members=4, resample_probability=0.0, explore={
        LR: {"log_uniform": [1e-4, 3e-3]}, ENT: {"uniform": [0.0, 0.05]}})
    rng = np.random.default_rng(0)
    values = {LR: 2.9e-3, ENT: 0.0}
    seen = []
    for _ in range(200):  # repeated x1.2 would walk past 3e-3; x0.8 never leaves 0
        values = explore(values, pop, rng)
        assert 1e-4 <= values[LR] <= 3e-3 and 0.0 <= values[ENT] <= 0.05, values
        seen.append(values[ENT])
    assert max(seen) > 0, "0 is left"
    listed = PopulationConfig(members=4, resample_probability=0.0,
                              explore={ENT: [0.0, 0.001, 0.01]})
    steps = {explore({ENT: 0.001}, listed, rng)[ENT] for _ in range(50)}
    assert steps == {0.0, 0.01}, "a listed value steps to a neighbouring choice"
    assert {explore({ENT: 0.01}, listed, rng)[ENT] for _ in range(50)} == {0.001, 0.01}


def test_a_ready_loser_copies_a_winner_and_the_others_are_kept() -> None:
    pop = PopulationConfig(members=4, exploit_fraction=0.25)
    views = [MemberView(f"m{i}", {LR: 10.0 ** -i}, version=100, ready_at=50, score=score)
             for i, score in enumerate([500.0, 300.0, 20.0, None])]
    exploits, kept = decide(views, pop, np.random.default_rng(0))
    assert [(e.member, e.donor) for e in exploits] == [("m2", "m0")]
    assert exploits[0].hyperparams == {LR: 1.0}, "nothing explored: the donor's values"
    assert kept == ["m0", "m1"], "m3 has no score yet: not ranked"
    views[2].ready_at = 150
    assert decide(views, pop, np.random.default_rng(0)) == ([], ["m0", "m1"])
    half = PopulationConfig(members=4, exploit_fraction=0.5)
    views = [MemberView(f"m{i}", {}, version=100, score=s) for i, s in enumerate([9, 1, 2, 8])]
    exploits, _ = decide(views, half, np.random.default_rng(1))
    assert sorted(e.member for e in exploits) == ["m1", "m2"]
    assert {e.donor for e in exploits} <= {"m0", "m3"}


def test_a_members_score_counts_only_rows_since_its_last_change() -> None:
    key, version = "policy/m1/episode_return_mean", "policy/m1/policy_version"
    rows = [{key: 10.0, version: 5}, {version: 8}, {key: 20.0, version: 12},
            {key: 40.0, version: 15}]
    assert member_score(rows, "m1", since=0, window=10) == pytest.approx(70 / 3)
    assert member_score(rows, "m1", since=10, window=10) == 30.0
    assert member_score(rows, "m1", since=12, window=1) == 40.0
    assert member_score(rows, "m1", since=15, window=10) is None
    assert member_score(rows, "m0", since=0, window=10) is None
    evaluated = [{"policy/m1/eval_return_mean": 100.0, "policy/m1/eval_policy_version": 9,
                  "policy/m1/policy_version": 12},
                 {"policy/m1/eval_return_mean": 300.0, "policy/m1/eval_policy_version": 20,
                  "policy/m1/policy_version": 21}]
    assert member_score(evaluated, "m1", 10, 10, "eval_return_mean") == 300.0, \
        "an evaluation counts by the version it evaluated"
    assert ranking_metric(population()) == "episode_return_mean"
    assert ranking_metric(population("evaluation.every_updates=10")) == "eval_return_mean"


def test_the_ranked_version_is_that_of_the_newest_value_the_score_counts() -> None:
    rows = [{"policy/m1/policy_version": 12, "policy/m1/episode_return_mean": 5.0},
            {"policy/m1/policy_version": 18},
            {"policy/m1/policy_version": 24, "policy/m1/episode_return_mean": 9.0},
            {"policy/m1/policy_version": 30}]  # no return: not what it was ranked on
    assert ranked_version(rows, "m1", since=0) == 24
    assert ranked_version(rows, "m1", since=24) is None
    evaluated = [{"policy/m1/eval_policy_version": 20, "policy/m1/eval_return_mean": 400.0,
                  "policy/m1/policy_version": 27}]
    assert ranked_version(evaluated, "m1", since=0, metric=ranking_metric(population(
        "evaluation.every_updates=10"))) == 20, "the version the evaluator scored"


def test_a_sweep_is_a_population_without_exploit() -> None:
    overrides = sweep_overrides([f"{LR}=1e-4,3e-4,1e-3"])
    config = make_config(overrides)
    assert config.population.members == 3 and not config.population.exploit
    assert config.population.initial == {LR: [1e-4, 3e-4, 1e-3]}
    grid = make_config(sweep_overrides([f"{LR}=1e-4,1e-3", "learner.ppo.ent_coef=0,0.01"]))
    assert grid.population.members == 4
    assert list(zip(*grid.population.initial.values(), strict=True)) == [
        (1e-4, 0.0), (1e-4, 0.01), (1e-3, 0.0), (1e-3, 0.01)]
    for bad, message in [([f"{LR}"], "must look like KEY=V1,V2"),
                         ([f"{LR}=a,b"], "the values must be numbers"),
                         ([f"{LR}=1e-4"], "at least two values"),
                         ([f"{LR}=1,2", f"{LR}=3,4"], "given twice")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            sweep_overrides(bad)


def test_each_member_is_a_whole_pipeline_and_one_manager_ranks_them() -> None:
    kinds = [(kind, policy) for kind, _, policy in worker_plan(population())]
    for member in ("m0", "m1", "m2", "m3"):
        assert kinds.count(("learner", member)) == kinds.count(("inference", member)) == 1
        assert kinds.count(("actor", member)) == 2, "actors.count per member"
    assert kinds.count(("population", "default")) == 1
    sweep = [kind for kind, _, _ in worker_plan(make_config(sweep_overrides([f"{LR}=1,2"])))]
    assert "population" not in sweep, "a sweep changes nothing: no manager"


@pytest.mark.parametrize(("overrides", "message"), [
    (["population.members=1"], "'population.members' must be 0 (off) or at least 2"),
    (["population.explore={learner.ppo.gamma: [0.9, 0.99]}"],
     "'population.explore.learner.ppo.gamma' is not a live hyperparameter of 'ppo' (live: "
     "learner.ppo.learning_rate, learner.ppo.ent_coef"),
    ([f"population.explore={{{LR}: {{log_uniform: [0, 1]}}}}"], "log_uniform needs lo > 0"),
    ([f"population.explore={{{LR}: {{normal: [0, 1]}}}}"], "must be {log_uniform: [lo, hi]}"),
    ([f"population.initial={{{LR}: [1, 2]}}"], "must list 4 values, one per member (got 2)"),
    (["population.exploit_fraction=0.7"], "'population.exploit_fraction' must be in (0, 0.5]"),
    (["checkpoint.enabled=false"], "copies members through checkpoints"),
])
def test_populations_that_cannot_train_are_one_line_errors(overrides: list[str],
                                                            message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        check_population(population(*overrides), PPO_LIVE)
    assert "\n" not in str(error.value)
