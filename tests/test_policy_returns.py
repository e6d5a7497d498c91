"""Per-policy returns in a multi-agent run: each policy is ranked, kept and stopped on by
its own return, the team sum is a named figure of its own.

The end-to-end checks (a run's rows, the evaluator's saved parameters,
`srl_jax.evaluate`) ride on tests/test_multi_agent.py's shared two-policy run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from actors.env_families.multi_agent import MultiAgentSplit
from learners.training.checkpoint import restore_params
from policy.evaluator import Evaluated, keep_best
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.metrics_table import POLICY_RETURN, TEAM_RETURN, agent_mean_returns
from srl_jax.launch import check_before_launch
from srl_jax.runtime.metrics import MetricsAggregator
from srl_jax.runtime.run_dir import evaluated_root, step_meta, steps_in
from srl_jax.runtime.stop_rule import StopRule
from tests.conftest import REPO

TAG = REPO / "configs" / "mpe_tag_ppo.yaml"
SPREAD = REPO / "configs" / "mpe_spread_ppo.yaml"


def test_each_policy_keeps_the_parameters_of_its_own_best_evaluation(tmp_path: Path) -> None:
    """After a first evaluation the adversaries improve at the second, the runner at the
    third (while the adversaries, and the team sum, fall), neither at the fourth: each
    keeps the version its own return chose."""
    root = lambda name: evaluated_root(tmp_path, name)  # noqa: E731 - the evaluator's own
    best: dict[str, float] = {}
    evaluations = [  # (version, adversary's returns, runner's returns)
        (10, [10.0, 20.0], [-30.0, -40.0]),
        (20, [40.0, 50.0], [-60.0, -50.0]),
        (30, [0.0, 10.0], [-10.0, 0.0]),
        (40, [30.0, 30.0], [-20.0, -20.0]),
    ]
    saved = []
    for version, adversary, runner in evaluations:
        team = [3 * a + r for a, r in zip(adversary, runner, strict=True)]
        saved.append(keep_best(best, [
            Evaluated("adversary", version, {"w": np.full(2, version, np.float32)}, adversary),
            Evaluated("runner", version + 1, {"w": np.full(2, version + 1, np.float32)},
                      runner)], root, {"team_eval_return_mean": float(np.mean(team))}))
    assert saved == [["adversary", "runner"], ["adversary"], ["runner"], []]
    assert best == {"adversary": 45.0, "runner": -5.0}
    for name, step, mean, team in (("adversary", 20, 45.0, 80.0), ("runner", 31, -5.0, 10.0)):
        assert steps_in(root(name)) == [step], f"{name}: only its best version is kept"
        meta = step_meta(root(name), step)
        assert meta["eval_return_mean"] == mean, "its own return, not the team's"
        assert meta["team_eval_return_mean"] == team and meta["version"] == step
        like = {"w": np.zeros(2, np.float32)}
        np.testing.assert_array_equal(restore_params(root(name), step, like).state["w"],
                                      np.full(2, step, np.float32))


def test_a_multi_agent_heartbeat_gives_the_team_sum_and_every_agents_mean() -> None:
    """Episodes of simple_tag played to their end: `team_return_mean` is the sum over all
    four agents, `episode_return_mean` the mean of every agent's own return, and each
    policy's row the mean of its own agents'."""
    config = load_config(TAG)
    split = MultiAgentSplit(config.env, 8, list(range(8)))
    rng = np.random.default_rng(0)
    try:
        while not (step := split.step([rng.integers(5, size=len(obs)).tolist()
                                       for obs in split.obs])).episode_returns:
            pass
    finally:
        split.close()
    adversary, runner = (np.asarray(r.episode_returns) for r in step.results)
    assert len(adversary) == 24 and len(runner) == 8, "8 envs: 3 adversaries, 1 runner each"
    team = step.episode_returns
    np.testing.assert_allclose(team, adversary.reshape(8, 3).sum(1) + runner, rtol=1e-6)
    assert adversary.max() > 0 > runner.min(), "random play: some collisions"
    metrics = MetricsAggregator()
    metrics.observe("actor-0", "actor", {"env_frames": 100}, {
        "episode_return": np.asarray(agent_mean_returns(team, 4)),
        "episode_length": np.full(8, 25), TEAM_RETURN: np.asarray(team),
        POLICY_RETURN + "adversary": adversary, POLICY_RETURN + "runner": runner})
    row = metrics.row(1.0)
    assert row["team_return_mean"] == pytest.approx(np.mean(team), abs=1e-3)
    assert row["episode_return_mean"] == pytest.approx(
        np.concatenate([adversary, runner]).mean(), abs=1e-3), "every agent's own, averaged"
    assert row["policy/adversary/episode_return_mean"] == pytest.approx(adversary.mean(),
                                                                        abs=1e-3)
    assert row["policy/runner/episode_return_mean"] == pytest.approx(runner.mean(), abs=1e-3)
    assert row["team_return_mean_last20"] == row["team_return_mean"], "8 episodes so far"
    assert row["episodes"] == 8, "env episodes"
    single = MetricsAggregator()
    single.observe("actor-0", "actor", {"env_frames": 100},
                   {"episode_return": np.array([7.0]), "episode_length": np.array([7])})
    assert not any(key.startswith("team_") for key in single.row(1.0)), "a single agent's"


def _stop_reason(config_path: Path, rows: list[dict], *overrides: str) -> str | None:
    """Why the run ends at the first of `rows` it ends at, or None."""
    rule = StopRule(check_before_launch(load_config(config_path, list(overrides))))
    reasons = [rule.reason({"env_frames": 1000, "time": 10.0, **row}) for row in rows]
    return next((reason for reason in reasons if reason), None)


def test_the_return_targets_read_the_chosen_policys_own_return() -> None:
    """A won game for the adversaries is a lost one for the runner: `stop.policy` names
    whose return ends the run; without it every policy's own return must reach it."""
    winning = {"episode_return_mean": 0.0, "team_return_mean": 20.0,
               "policy/adversary/episode_return_mean": 10.0,
               "policy/runner/episode_return_mean": -10.0}
    assert _stop_reason(TAG, [winning], "stop.target_return=5",
                        "stop.policy=adversary") == (
        "policy adversary's episode_return_mean reached the target 5 (10.0) at 1000 "
        "frames, 10.0s")
    assert _stop_reason(TAG, [winning], "stop.target_return=5",
                        "stop.policy=runner") is None
    assert _stop_reason(TAG, [winning], "stop.target_return=5") is None, \
        "every policy: the runner has not"
    evaluated = {"eval_return_mean": -1.0, "team_eval_return_mean": -4.0,
                 "policy/adversary/eval_return_mean": 2.0,
                 "policy/runner/eval_return_mean": -10.0}
    assert _stop_reason(TAG, [evaluated], "stop.target_eval_return=-12",
                        "evaluation.every_updates=5") == (
        "every trained policy's eval_return_mean reached the target -12 (lowest -10.0) at 1000 "
        "frames, 10.0s")
    assert _stop_reason(TAG, [
        {"policy/adversary/episode_return_mean": 9.0},
        {"policy/runner/episode_return_mean": 8.0}], "stop.target_return=8") is not None, \
        "each policy's latest figure counts, whichever row brought it"
    shared = {"episode_return_mean": -20.0, "team_return_mean": -60.0,
              "policy/default/episode_return_mean": -20.0}
    assert _stop_reason(SPREAD, [shared], "stop.target_return=-30") == (
        "every trained policy's episode_return_mean reached the target -30 (-20.0) at 1000 frames, "
        "10.0s"), "one shared policy: its agents' mean return, never the team sum"
    cartpole = REPO / "configs" / "cartpole_ppo.yaml"
    assert _stop_reason(cartpole, [{"episode_return_mean": 480.0}]) == (
        "episode_return_mean 480.0 reached the target 475 at 1000 frames, 10.0s")


@pytest.mark.parametrize("config, override, message", [
    (TAG, "stop.policy=hunter", "'stop.policy': no policy 'hunter' (env.policies: "
                                "adversary, runner)"),
    (REPO / "configs" / "cartpole_ppo.yaml", "stop.policy=default",
     "'stop.policy' chooses among a multi-agent run's policies"),
])
def test_a_stop_policy_that_names_no_policy_is_refused(config, override, message) -> None:
    with pytest.raises(ConfigError) as error:
        check_before_launch(load_config(config, [override]))
    assert message in str(error.value)


def test_the_competitive_config_gives_each_side_its_agents() -> None:
    config = check_before_launch(load_config(TAG))
    specs = MultiAgentSplit(config.env, 1, [0])
    try:
        assert specs.agents == {"adversary": ["adversary_0", "adversary_1", "adversary_2"],
                                "runner": ["agent_0"]}
    finally:
        specs.close()
