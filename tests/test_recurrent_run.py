"""A recurrent experiment end to end: `cartpole_lstm_ppo` (CartPole without velocities,
an LSTM policy) in real processes reaches its target through a killed actor and a
killed inference server, both restarted, and the policy it saved plays with its memory
in the evaluator and through `load_policy` (what `srl_jax.evaluate` plays with)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from actors.envs import make_env
from learners.export import TrainedPolicy, load_policy, play_episode
from tests.conftest import (
    Processes,
    all_running,
    launch,
    read_metrics,
    read_status,
    wait_for,
    wait_restarted,
    worker,
)

pytestmark = pytest.mark.slow
SEEDS = range(3)


def forgetful_return(policy: TrainedPolicy, env, seed: int) -> float:
    """One episode in which the policy's state is reset before every step: no memory."""
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        policy.reset()
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
        total, done = total + float(reward), terminated or truncated
    return total


def test_lstm_ppo_reaches_its_target_through_a_killed_actor_and_inference_server(
        processes: Processes, tmp_path: Path) -> None:
    """The server dies first: until its successor serves, nothing moves, so the run cannot
    reach its target before both successors are seen running."""
    process, run_dir = launch(processes, tmp_path, "stop.wall_time_s=240",
                              "evaluation.every_updates=25", "evaluation.episodes=2",
                              "actors.inference_timeout_s=1", "runtime.restart_backoff_s=0.2",
                              experiment="cartpole_lstm_ppo")
    wait_for(lambda: all_running(run_dir) and (rows := read_metrics(run_dir))
             and rows[-1]["learner_steps"] >= 10, 120, "a few updates")
    victims = {name: worker(read_status(run_dir), name)["pid"]
               for name in ("inference-0", "actor-0")}
    for victim in victims.values():
        Processes.kill(victim)
    for name, victim in reversed(victims.items()):
        wait_restarted(run_dir, name, victim, 60)
    assert process.wait(timeout=240) == 0, (tmp_path / "launch.log").read_text()
    final = read_status(run_dir)
    assert "reached the target" in final["stop_reason"], final["stop_reason"]
    assert [worker(final, name)["restarts"] for name in victims] == [1, 1]
    rows = read_metrics(run_dir)
    assert rows[-1]["system/restarts"] == 2
    assert rows[-1]["system/wire_rejected"] == 0, "every request carried a well-formed state"
    assert any("eval_return_mean" in row for row in rows), "the evaluator played the LSTM"

    # Velocities are masked: the policy balances only by remembering earlier positions.
    policy = load_policy(run_dir)
    env = make_env(policy.config.env)
    with_memory = np.mean([play_episode(policy, env, seed)[0] for seed in SEEDS])
    without = np.mean([forgetful_return(policy, env, seed) for seed in SEEDS])
    assert with_memory >= 200 and without < 100, (with_memory, without)
