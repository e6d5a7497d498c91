"""A recurrent experiment end to end: `cartpole_lstm_ppo` (CartPole without velocities,
an LSTM policy) in real processes, through remote inference, a killed actor and a
killed inference server (both restarted), to its frame budget; then the best policy its
evaluator saved plays with its memory in `srl_jax.evaluate` and through `load_policy`.
The evaluator's and `srl_jax.evaluate`'s end-to-end checks live here: one trained run
serves them all."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from actors.envs import env_seed, make_env
from policy.evaluator import EVALUATOR_ACTOR_INDEX
from policy.export import TrainedPolicy, load_policy, play_episode
from srl_jax.runtime.run_dir import evaluated_root, step_meta, steps_in
from tests.conftest import (
    CARTPOLE_MARGIN,
    CARTPOLE_RANDOM_RETURN,
    Processes,
    all_running,
    assert_learned,
    ended_on_frames,
    launch,
    read_metrics,
    read_status,
    wait_for,
    wait_restarted,
    worker,
)

pytestmark = pytest.mark.slow
FRAMES = 250_000
"""The run's frame budget: with the kills, the best mean return of 100 episodes was 189-278
there and the best evaluation 223-500 (4 runs on 2 cores under others' load). It used to
stop at an evaluation of 300 (at 155,000 frames once, without the kills)."""


def forgetful_return(policy: TrainedPolicy, env, seed: int) -> float:
    """One episode in which the policy's state is reset before every step: no memory."""
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        policy.reset()
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
        total, done = total + float(reward), terminated or truncated
    return total


def test_lstm_ppo_learns_through_a_killed_actor_and_inference_server(
        processes: Processes, tmp_path: Path) -> None:
    """The server dies first: until its successor serves, nothing moves, so the run cannot
    reach its frame budget before both successors are seen running."""
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              f"stop.env_frames={FRAMES}",
                              "evaluation.every_updates=10", "evaluation.episodes=10",
                              "actors.inference_timeout_s=1", "runtime.restart_backoff_s=0.2",
                              # One actor: its 64 envs act more than the learner takes, and
                              # a second one's frames would only take CPU from the learner.
                              "actors.count=1", experiment="cartpole_lstm_ppo")
    wait_for(lambda: all_running(run_dir) and (rows := read_metrics(run_dir))
             and rows[-1]["learner_steps"] >= 10, 120, "a few updates")
    victims = {name: worker(read_status(run_dir), name)["pid"]
               for name in ("inference-0", "actor-0")}
    for victim in victims.values():
        Processes.kill(victim)
    for name, victim in reversed(victims.items()):
        wait_restarted(run_dir, name, victim, 60)
    rows, final = ended_on_frames(process, run_dir, FRAMES, tmp_path / "launch.log")
    assert_learned(rows, CARTPOLE_RANDOM_RETURN, CARTPOLE_MARGIN)
    assert all(a["env_frames"] <= b["env_frames"] for a, b in itertools.pairwise(rows))
    assert any("policy_lag_mean" in r for r in rows)
    assert rows[-1]["system/restarts"] == 2
    assert rows[-1]["system/wire_rejected"] == 0, "every request carried a well-formed state"
    assert sorted(w["kind"] for w in final["workers"]) == [
        "actor", "evaluator", "inference", "learner"]
    assert len({w["pid"] for w in final["workers"]} | {final["controller_pid"]}) == 5
    assert [worker(final, name)["restarts"] for name in victims] == [1, 1]
    # The evaluator worker: deterministic episodes every 10 versions, apart from training.
    evaluated = [r for r in rows if "eval_return_mean" in r]
    assert evaluated and all(0 < r["eval_return_mean"] <= 500 for r in evaluated)
    versions = [r["eval_policy_version"] for r in evaluated]
    assert versions == sorted(versions) and all(
        b - a >= 10 for a, b in itertools.pairwise(versions))
    assert worker(final, "evaluator-0")["restarts"] == 0
    # The best so far is kept, saved before its score is sent: at least every row's score
    # (two evaluations may share a metrics row, whose score is then their mean; rows are
    # rounded). Ten episodes an evaluation keep a lucky one from passing for learning.
    [best] = steps_in(evaluated_root(run_dir))
    best_score = step_meta(evaluated_root(run_dir), best)["eval_return_mean"]
    assert best <= versions[-1] and best_score >= max(
        r["eval_return_mean"] for r in evaluated) - 1e-3
    assert best_score >= CARTPOLE_RANDOM_RETURN + CARTPOLE_MARGIN, best_score

    # The best checkpoint is the policy the evaluator scored: on the evaluator's own
    # episodes it plays exactly that score (on other seeds an LSTM policy's returns spread
    # widely: once 4 of 5 at 487-500 and one at 227, caught at 500).
    policy = load_policy(run_dir, best=True)
    env = make_env(policy.config.env)
    seeds = [env_seed(policy.config.seed, EVALUATOR_ACTOR_INDEX, episode)
             for episode in range(10)]
    with_memory = np.mean([play_episode(policy, env, seed)[0] for seed in seeds])
    assert with_memory == best_score
    # Velocities are masked: the policy balances only by remembering earlier positions.
    without = np.mean([forgetful_return(policy, env, seed) for seed in seeds])
    assert without < 100, without

    video = tmp_path / "episode.mp4"
    result = subprocess.run(
        [sys.executable, "-m", "srl_jax.evaluate", str(run_dir), "--best", "--episodes", "5",
         "--video", str(video)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # It plays the best checkpoint with its memory: episode for episode (seeds 0 to 4), the
    # returns played here. A floor on their mean would not hold: at a best of 300, once
    # 293, 275, 152, 157 and 180, a mean of 211.
    played = [float(r) for r in re.findall(r"^episode \d+/5: return ([\d.]+)", result.stdout,
                                             re.M)]
    assert played == [play_episode(policy, env, seed)[0] for seed in range(5)], result.stdout
    assert video.stat().st_size > 10_000
