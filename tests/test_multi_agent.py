"""Multi-agent runs: agents mapped to policies, each policy with its own learner and
inference server, per-policy chunks, checkpoints and metrics, end to end on MPE.

The environment side (columns, agent ids, rewards, resets) is tested in
tests/test_multi_agent_env.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from actors.envs import env_spec
from policy.export import load_policy, load_team
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError, policy_names, request_rows
from srl_jax.dataflow.chunk_spec import run_chunk_layout
from srl_jax.dataflow.metrics_table import POLICY_RETURN, TEAM_RETURN
from srl_jax.launch import check_before_launch
from srl_jax.runtime.metrics import MetricsAggregator
from srl_jax.runtime.run_dir import (
    checkpoint_steps,
    evaluated_root,
    read_status,
    step_meta,
    steps_in,
)
from srl_jax.wire.streams import send
from tests.conftest import REPO, read_metrics, stop_when, write_run_dir
from tests.fakes import FakeServerAndLearner

SPREAD = REPO / "configs" / "mpe_spread_ppo.yaml"
TWO_POLICIES = "env.policies={first: [agent_0], others: ['agent_*']}"
SMALL = ("actors.count=1", "actors.envs=4", "actors.splits=2", "inference.max_batch=12",
         "learner.ppo.epochs=1", "checkpoint.every_updates=2", "learner.sample_queue=8")
"""A short sample queue: the actor waits for the learner after about 1,000 frames, so
frames do not race far ahead of updates while the learner compiles."""


@pytest.mark.parametrize("override, message", [
    ("env.id=pettingzoo:mpe2.no_such_game", "'env.id': no module 'mpe2.no_such_game'"),
    ("env.policies={red: [adversary_*]}",
     "'env.policies': agent 'agent_0' of 'pettingzoo:mpe2.simple_spread_v3' matches no policy"),
    ("env.policies={2nd: ['*']}", "'env.policies': policy name '2nd' must start with a letter"),
    ("env.policies={best: ['*']}", "not be best or evaluated"),
    ("env.policies={red: agent_0}", "'env.policies.red' must be a list of agent name patterns"),
    ("inference.max_batch=32",
     "'inference.max_batch' (32) must hold the 48 rows of one request for policy 'default': "
     "8 envs a split x 3 agents, twice over when a time limit ends episodes (their final "
     "observations ride along)"),
    ((TWO_POLICIES, "inference.max_batch=24"),
     "'inference.max_batch' (24) must hold the 32 rows of one request for policy 'others': "
     "8 envs a split x 2 agents"),
    ("env.backend=envpool", "'env.backend': pettingzoo environments step with 'gymnasium', "
                            "not 'envpool'"),
    ("env.kwargs.N=two", "'env.kwargs': cannot make"),
])
def test_multi_agent_config_errors_name_the_key(override, message):
    """What the launcher checks before anything starts (the exit code: tests/test_config.py)."""
    overrides = [override] if isinstance(override, str) else list(override)
    with pytest.raises(ConfigError) as error:
        check_before_launch(load_config(SPREAD, overrides))
    assert message in str(error.value)


def test_the_shipped_config_passes_its_request_rows_check():
    """Requests of 24 rows (8 envs x 3 agents), 48 when max_cycles ends every episode:
    max_batch 96 holds the four that two actors of two splits can have in flight."""
    config = check_before_launch(load_config(SPREAD))
    assert request_rows(config.actors, env_spec(config.env).agents) == 48
    assert config.inference.max_batch == 96


def test_policies_get_their_agents_columns_in_the_chunk_layout():
    shared = load_config(SPREAD)
    assert policy_names(shared.env) == ["default"]
    spec = env_spec(shared.env)
    assert spec.agents == 3 and spec.obs_shape == (21,), "18 observed + a 3-way agent id"
    assert run_chunk_layout(shared, spec)["obs"][0] == (26, 24, 21), "8 envs x 3 agents a split"

    split = load_config(SPREAD, [TWO_POLICIES])
    assert policy_names(split.env) == ["first", "others"]
    first, others = env_spec(split.env, "first"), env_spec(split.env, "others")
    assert (first.agents, first.obs_shape) == (1, (18,)), "one agent: no id to append"
    assert (others.agents, others.obs_shape) == (2, (20,))
    assert run_chunk_layout(split, first)["actions"][0] == (25, 8)
    assert run_chunk_layout(split, others)["actions"][0] == (25, 16)


def test_metrics_report_each_policy_and_the_team():
    metrics = MetricsAggregator()
    metrics.observe("learner-first-0", "learner", {"learner_steps": 7, "train/loss": 0.5,
                                                   "checkpoint_step": 6}, {}, policy="first")
    metrics.observe("learner-others-0", "learner", {"learner_steps": 3, "train/loss": 0.25},
                    {}, policy="others")
    metrics.observe("actor-0", "actor", {"env_frames": 100}, {
        "episode_return": np.array([-20.0, -30.0]), "episode_length": np.array([25, 25]),
        TEAM_RETURN: np.array([-60.0, -90.0]),
        POLICY_RETURN + "first": np.array([-20.0, -30.0]),
        POLICY_RETURN + "others": np.array([-20.0, -20.0, -30.0, -30.0])})
    row = metrics.row(1.0)
    assert row["episode_return_mean"] == -25.0, "the mean of every agent's own return"
    assert row["team_return_mean"] == -75.0, "all agents' rewards summed"
    assert row["policy/first/episode_return_mean"] == -25.0
    assert row["policy/others/episode_return_mean"] == -25.0
    assert row["policy/first/policy_version"] == 7
    assert row["policy/others/policy_version"] == 3
    assert row["policy/first/checkpoint_step"] == 6, "what a resume falls back on"
    assert "policy/others/checkpoint_step" not in row, "none made or restored yet"
    assert row["policy_version"] == 7, "the contract key: the furthest policy"
    assert row["learner/first/loss"] == 0.5 and row["learner/others/loss"] == 0.25
    assert "policy/first/episode_return_mean" not in metrics.row(2.0), "a window's episodes"


def _run(processes, tmp_path, *overrides: str, resume: bool = False,
         until: Callable[[dict], bool] | None = None) -> tuple:
    """Run the MPE config until it stops on its own condition (its frame limit is far)
    or, with `until`, until a metrics row satisfies it, then Ctrl-C (conftest.stop_when)."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", "mpe_spread_ppo", "--run-dir",
            str(run_dir), "--quiet", *(["--resume"] if resume else [])]
    for override in (*([] if resume else SMALL), "stop.env_frames=10000000", *overrides):
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    if until is None:
        assert process.wait(timeout=120) == 0, (tmp_path / "launch.log").read_text()
        return run_dir, read_metrics(run_dir)
    return run_dir, stop_when(process, run_dir, until, 120, tmp_path / "launch.log")


@pytest.mark.slow
def test_a_recurrent_shared_policy_streams_every_agent_through_remote_inference(processes,
                                                                              tmp_path):
    """With a GRU: each agent column carries its own state through requests and chunks."""
    run_dir, rows = _run(processes, tmp_path, "learner.batch_envs=12", "network.core=gru",
                         "network.core_size=16",
                         until=lambda row: row["env_frames"] >= 1500 and row["learner_steps"] >= 2)
    last = rows[-1]
    assert last["env_frames"] >= 1500 and last["learner_steps"] >= 2
    assert last["system/wire_rejected"] == 0
    assert any(r.get("inference/batch_rows_mean", 0) >= 6 for r in rows), "6 agents a split"
    returned = [r for r in rows if "episode_return_mean" in r]
    assert returned and all(r["episode_return_mean"] < 0 for r in returned)
    for r in returned:  # one shared policy: its agents' mean return is every agent's
        assert r["policy/default/episode_return_mean"] == pytest.approx(
            r["episode_return_mean"], abs=0.002)
        assert r["team_return_mean"] == pytest.approx(3 * r["episode_return_mean"], abs=0.01)
    assert [w["name"] for w in read_status(run_dir)["workers"]] == [
        "learner-0", "inference-0", "actor-0"]
    assert checkpoint_steps(run_dir), "the default policy checkpoints where it always did"


@pytest.mark.slow
def test_each_policy_has_its_own_workers_evaluations_checkpoints_and_resume(processes, tmp_path):
    """One run stops on its first team evaluation; a resume of it trains both policies on."""
    run_dir, rows = _run(processes, tmp_path, TWO_POLICIES, "learner.batch_envs=8",
                         "evaluation.every_updates=2", "evaluation.episodes=3",
                         "stop.target_eval_return=-1e9")
    final = read_status(run_dir)
    assert "eval_return_mean" in final["stop_reason"]
    assert rows[-1]["system/wire_rejected"] == 0
    assert any("policy/first/episode_return_mean" in r for r in rows)
    assert any("policy/others/episode_return_mean" in r for r in rows)
    workers = {w["name"]: w for w in final["workers"]}
    assert set(workers) == {"learner-first-0", "inference-first-0", "learner-others-0",
                            "inference-others-0", "actor-0", "evaluator-0"}
    assert workers["learner-others-0"]["policy"] == "others"
    for policy in ("first", "others"):
        assert checkpoint_steps(run_dir, policy=policy), f"{policy} has its own checkpoints"
        assert (run_dir / "logs" / f"learner-{policy}-0.log").exists()
    assert not checkpoint_steps(run_dir), "no policy is the default one"

    evaluated = [r for r in rows if "eval_return_mean" in r]
    assert evaluated and all(r["eval_return_mean"] < 0 for r in evaluated), "MPE returns"
    for r in evaluated:  # 1 + 2 agents: every agent's mean, and the sum of all three
        own = r["policy/first/eval_return_mean"] + 2 * r["policy/others/eval_return_mean"]
        assert r["eval_return_mean"] == pytest.approx(own / 3, abs=0.01)
        assert r["team_eval_return_mean"] == pytest.approx(own, abs=0.01)
        assert r["policy/others/eval_policy_version"] >= r["eval_policy_version"]
    saved = {}
    for policy in ("first", "others"):
        steps = steps_in(evaluated_root(run_dir, policy))
        assert len(steps) == 1, f"{policy}'s parameters of its best evaluation"
        meta = step_meta(evaluated_root(run_dir, policy), steps[0])
        best = max(r[f"policy/{policy}/eval_return_mean"] for r in evaluated)
        # A row shows the mean of its window's evaluations: the best alone can be higher.
        assert meta["eval_return_mean"] >= best - 1e-3, "its own best (rows are rounded)"
        saved[policy] = steps[0]
    returned = [r for r in rows if "episode_return_mean" in r]
    assert returned and all(r["team_return_mean"] == pytest.approx(
        3 * r["episode_return_mean"], abs=0.01) for r in returned), "3 agents: sum = 3 x mean"
    assert not steps_in(evaluated_root(run_dir)), "no policy is the default one"
    team = load_team(run_dir, best=True)
    assert list(team) == ["first", "others"]
    assert {name: policy.step for name, policy in team.items()} == saved
    assert (team["first"].spec.agents, team["others"].spec.agents) == (1, 2)

    video = tmp_path / "team.mp4"
    evaluate = subprocess.run([sys.executable, "-m", "srl_jax.evaluate", str(run_dir), "--best",
                               "--episodes", "2", "--video", str(video)],
                              capture_output=True, text=True, timeout=120)
    assert evaluate.returncode == 0, evaluate.stderr
    out = evaluate.stdout
    assert (f"checkpoint step first {saved['first']}, others {saved['others']}" in out)
    episodes = [line for line in out.splitlines() if line.startswith("episode ")]
    assert len(episodes) == 2 and all("length 25" in line for line in episodes), out
    assert all("(first " in line and "; team " in line for line in episodes), out
    assert float(out.split("mean return ")[1].split()[0]) < 0
    assert "policy first: mean return" in out and "policy others: mean return" in out
    assert "team: mean return" in out
    assert video.stat().st_size > 0

    steps = {p: checkpoint_steps(run_dir, policy=p)[-1] for p in ("first", "others")}
    past = {p: step + 1 for p, step in steps.items()}
    # The resume trains on without the evaluator (the first run checked its evaluations).
    _, resumed = _run(processes, tmp_path, "stop.target_eval_return=null",
                      "evaluation.every_updates=0", resume=True,
                      until=lambda row: row.get("system/resumes") == 1 and all(
                          row.get(f"policy/{p}/policy_version", 0) >= past[p] for p in past))
    assert f"resumes from checkpoint first {steps['first']}, others {steps['others']}" in \
        (tmp_path / "launch.log").read_text()
    for policy in ("first", "others"):
        log = (run_dir / "logs" / f"learner-{policy}-0.log").read_text()
        assert f"restored checkpoint step {steps[policy]}" in log
    assert resumed[-1]["system/resumes"] == 1
    assert resumed[-1]["env_frames"] > max(r["env_frames"] for r in rows)
    kept = resumed[:len(resumed) - sum(r.get("system/resumes") == 1 for r in resumed)]
    assert all(r["policy/first/policy_version"] <= steps["first"] for r in kept
               if "policy/first/policy_version" in r), "rows past a checkpoint were trimmed"

    others = load_policy(run_dir, policy="others")
    assert others.spec.obs_shape == (20,) and others.step >= steps["others"]
    actions = others.act_batch(np.zeros((3, 20), np.float32))
    assert actions.shape == (3,) and ((actions >= 0) & (actions < 5)).all()


class ConstantPolicy(FakeServerAndLearner):
    """Answers every request with action `column % 5` at version 0."""

    def __init__(self, run_dir, policy: str) -> None:
        super().__init__(run_dir, policy)
        self.requests: list[np.ndarray] = []

    def answer(self, routing, message) -> None:
        obs = message.arrays["obs"].copy()
        self.requests.append(obs)
        self.replies += 1
        rows = len(obs)
        send(self.router, "infer_reply",
             {"split": message.meta["split"], "seq": message.meta["seq"], "version": 0},
             {"action": (np.arange(rows) % 5).astype(np.int32),
              "logp": np.full(rows, -1.0, np.float32), "value": np.zeros(rows, np.float32)},
             routing=routing)


@pytest.mark.slow
def test_an_actor_steps_once_every_policy_answered_and_sends_each_its_agents(
        tmp_path, processes, stats_socket):
    T = 5
    config = load_config(SPREAD, [TWO_POLICIES, "actors.count=1", "actors.envs=2",
                                  "actors.splits=1", f"actors.trajectory_length={T}",
                                  "actors.inference_timeout_s=60", "learner.batch_envs=8"])
    run_dir = write_run_dir(tmp_path / "run", config)
    first, others = ConstantPolicy(run_dir, "first"), ConstantPolicy(run_dir, "others")
    try:
        actor = processes.worker("actor", 0, run_dir)
        first.serve(lambda: first.replies >= 1 or actor.poll() is not None, timeout=60)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # 'others' keeps the split waiting
            first.serve_once(poll_ms=50)
        assert first.replies == 1, "no step, so no new request, before every policy answered"
        while len(first.chunks) < 2 or len(others.chunks) < 2:
            assert actor.poll() is None, (run_dir / "logs" / "actor-0.log").read_text()
            first.serve_once(poll_ms=20)
            others.serve_once(poll_ms=20)
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=15) == 0
    finally:
        first.close()
        others.close()
    assert first.rejects.count == others.rejects.count == 0
    assert abs(len(first.requests) - len(others.requests)) <= 1, "the policies act in lockstep"
    for fake, columns, width in ((first, 2, 18), (others, 4, 20)):
        chunk = fake.chunks[0]
        assert chunk["obs"].shape == (T + 1, columns, width)
        np.testing.assert_array_equal(chunk["actions"], np.tile(np.arange(columns) % 5, (T, 1)))
        np.testing.assert_array_equal(chunk["obs"][0], fake.requests[0][:columns])
    ids = others.chunks[0]["obs"][:, :, -2:]
    np.testing.assert_array_equal(ids, np.tile(np.eye(2), (T + 1, 2, 1)),
                                  "agent_1 and agent_2 of each env, told apart")
