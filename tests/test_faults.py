"""Failure injection: workers that raise inside their loop, keep failing, or freeze.

The faults are real: an environment that raises in the actor's loop (the way a
buggy or crashing env does), any worker raising from its loop (srl_jax/faults.py),
and SIGSTOP. Each run must recover and train on (to its stop condition, or for a
frozen worker until Ctrl-C), or, past the retry budget, end with one line, a
non-zero exit and a final checkpoint. A server restarted on a new port is found again
through the name service. Kills of every worker kind are in tests/test_run.py and
tests/test_resume.py; a stopped server that comes back in tests/test_status.py.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
from pathlib import Path

import gymnasium as gym
import pytest

from actors.actor_worker import split_seeds
from srl_jax.faults import FAULTS_ENV
from srl_jax.incarnation import FIRST, Incarnation
from srl_jax.names import FileNameService
from srl_jax.run_dir import checkpoint_steps, read_run_config
from srl_jax.stream_table import INFERENCE
from tests.conftest import (
    REPO,
    Processes,
    all_running,
    launch,
    logged_env_seeds,
    pid_alive,
    read_metrics,
    read_status,
    wait_for,
    wait_restarted,
    worker,
)

pytestmark = pytest.mark.slow

FAULTY_ID = "FaultyCartPole-v1"
SMALL = ("actors.envs=4", "actors.splits=2", "learner.batch_envs=8",
         "stop.target_return=null", "runtime.restart_backoff_s=0.2")


class FaultyCartPole(gym.Wrapper):
    """CartPole that raises on step `after` while the file `fault` exists ('once': the
    file goes with the first fault, so the restarted actor runs on)."""

    def __init__(self, fault: str, after: int, once: bool = True) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fault, self.after, self.once, self.steps = Path(fault), after, once, 0

    def step(self, action):
        self.steps += 1
        if self.steps >= self.after and self.fault.exists():
            if self.once:
                self.fault.unlink(missing_ok=True)
            raise RuntimeError(f"injected fault at step {self.steps}")
        return super().step(action)


if FAULTY_ID not in gym.envs.registry:
    gym.register(FAULTY_ID, entry_point=FaultyCartPole)


@pytest.fixture
def repo_importable(monkeypatch):
    """Workers import this module (for the faulty env) from the repository root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))


def faulty(fault: Path, after: int, once: bool) -> list[str]:
    return [f"env.id={__name__}:{FAULTY_ID}",
            f"env.kwargs={{fault: '{fault}', after: {after}, once: {str(once).lower()}}}"]


def test_an_actor_that_raises_is_restarted_and_the_run_finishes(
        processes: Processes, tmp_path: Path, repo_importable) -> None:
    fault = tmp_path / "fault"
    fault.touch()
    process, run_dir = launch(processes, tmp_path, *SMALL, *faulty(fault, 300, once=True),
                              "stop.env_frames=12000")
    assert process.wait(timeout=120) == 0, (tmp_path / "launch.log").read_text()
    assert not fault.exists(), "the fault fired"
    final = read_status(run_dir)
    assert final["state"] == "finished"
    actors = [w for w in final["workers"] if w["kind"] == "actor"]
    assert sorted(w["restarts"] for w in actors) == [0, 1]
    failed = next(w for w in actors if w["restarts"] == 1)
    log = (run_dir / "logs" / f"{failed['name']}.log").read_text()
    assert "RuntimeError: injected fault at step 300" in log
    rows = read_metrics(run_dir)
    assert rows[-1]["system/restarts"] == 1 and rows[-1]["env_frames"] >= 12000
    # The restarted actor played new episodes: its envs were seeded anew, reproducibly.
    config, restarted = read_run_config(run_dir), Incarnation(0, 1)
    for actor in actors:
        starts = [FIRST, restarted] if actor is failed else [FIRST]
        assert logged_env_seeds(run_dir, actor["index"]) == {
            start: split_seeds(config, actor["index"], start) for start in starts}
    seeds = logged_env_seeds(run_dir, failed["index"])
    assert set(itertools.chain(*seeds[FIRST])).isdisjoint(itertools.chain(*seeds[restarted]))


def test_a_worker_that_keeps_failing_ends_the_run_with_one_line_and_a_checkpoint(
        processes: Processes, tmp_path: Path, repo_importable) -> None:
    fault = tmp_path / "fault"
    fault.touch()
    process, run_dir = launch(processes, tmp_path, *SMALL, *faulty(fault, 150, once=False),
                              "runtime.max_restarts=2", "stop.env_frames=1000000",
                              "checkpoint.every_updates=1")
    assert process.wait(timeout=120) == 1, (tmp_path / "launch.log").read_text()
    last = (tmp_path / "launch.log").read_text().strip().splitlines()[-1]
    assert re.fullmatch(r"failed: actor-\d exited with code 1 after 2 restarts; see "
                        rf"{re.escape(str(run_dir))}/logs/actor-\d\.log \(run directory: "
                        rf"{re.escape(str(run_dir))}\)", last), last
    final = read_status(run_dir)
    assert final["state"] == "failed"
    assert any(w["state"] == "failed" and w["restarts"] == 2 for w in final["workers"])
    learner = worker(final, "learner-0")
    assert learner["state"] == "stopped" and learner["exit_code"] == 0, "stopped, not killed"
    assert checkpoint_steps(run_dir), "the learner's final checkpoint"


@pytest.mark.parametrize("name", ["actor-0", "inference-0", "learner-0"])
def test_a_frozen_worker_is_killed_at_the_heartbeat_timeout_and_replaced(
        processes: Processes, tmp_path: Path, name: str) -> None:
    """No frame limit: the actors outrun a frozen learner, so a limit could end the run
    before the successor starts. The run goes on until the successor has trained."""
    process, run_dir = launch(processes, tmp_path, *SMALL, "stop.wall_time_s=600",
                              "runtime.heartbeat_timeout_s=8", "actors.inference_timeout_s=1",
                              "checkpoint.every_updates=5")
    wait_for(lambda: all_running(run_dir) and read_metrics(run_dir)[-1]["learner_steps"] > 5
             and checkpoint_steps(run_dir), 90, "a run past its first checkpoint")
    frozen = worker(read_status(run_dir), name)["pid"]
    os.kill(frozen, signal.SIGSTOP)
    frozen_at = read_metrics(run_dir)[-1]

    def replaced_and_working() -> bool:
        replaced, last = worker(read_status(run_dir), name), read_metrics(run_dir)[-1]
        return replaced["pid"] != frozen and replaced["state"] == "running" \
            and last["learner_steps"] > frozen_at["learner_steps"] + 5 \
            and last["env_frames"] > frozen_at["env_frames"]

    wait_for(replaced_and_working, 120, f"a successor of {name} that trains")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130, (tmp_path / "launch.log").read_text()
    log = (run_dir / "logs" / "controller.log").read_text()
    assert re.search(rf"no heartbeat from {name} for \d+s; killing it", log)
    assert worker(read_status(run_dir), name)["restarts"] == 1
    if name == "learner-0":
        assert "restored checkpoint step" in (run_dir / "logs" / "learner-0.log").read_text()


@pytest.mark.parametrize("name", ["inference-0", "learner-0"])  # an actor: its env raises
def test_a_worker_that_raises_in_its_loop_is_restarted_and_loses_nothing_saved(
        processes: Processes, tmp_path: Path, name: str) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / name).write_text("4")
    process, run_dir = launch(processes, tmp_path, *SMALL, "stop.env_frames=20000",
                              "checkpoint.every_updates=5", env={FAULTS_ENV: str(faults)})
    assert process.wait(timeout=120) == 0, (tmp_path / "launch.log").read_text()
    assert not (faults / name).exists(), "the fault fired"
    final = read_status(run_dir)
    assert final["state"] == "finished"
    assert {w["name"]: w["restarts"] for w in final["workers"] if w["restarts"]} == {name: 1}
    assert "srl_jax.faults.InjectedFault: injected by" in \
        (run_dir / "logs" / f"{name}.log").read_text()
    if name == "learner-0":
        log = (run_dir / "logs" / "learner-0.log").read_text()
        restored = int(re.search(r"restored checkpoint step (\d+)", log).group(1))
        assert restored >= 5, "the successor went on from the checkpoint, not from scratch"
    rows = read_metrics(run_dir)
    assert rows[-1]["env_frames"] >= 20000 and rows[-1]["system/restarts"] == 1


def test_an_evaluator_that_raises_is_restarted_and_evaluates_again(
        processes: Processes, tmp_path: Path) -> None:
    """No frame limit: training does not wait for the evaluator, so a limit could end
    the run before the successor evaluates."""
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "evaluator-0").write_text("4")
    process, run_dir = launch(processes, tmp_path, *SMALL, "stop.wall_time_s=600",
                              "evaluation.every_updates=5", "evaluation.episodes=2",
                              env={FAULTS_ENV: str(faults)})
    log = run_dir / "logs" / "evaluator-0.log"
    restarted = wait_for(lambda: (w := worker(read_status(run_dir), "evaluator-0"))
                         and w["restarts"] == 1 and w["state"] == "running" and w, 120,
                         "the evaluator restarted")
    assert "srl_jax.faults.InjectedFault: injected by" in log.read_text()
    evaluated = len([r for r in read_metrics(run_dir) if "eval_return_mean" in r])
    wait_for(lambda: len([r for r in read_metrics(run_dir) if "eval_return_mean" in r])
             > evaluated, 120, "an evaluation by the successor")
    assert pid_alive(restarted["pid"])
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130, (tmp_path / "launch.log").read_text()
    assert log.read_text().count(": running\n") == 2, "both evaluators ran"
    status = read_status(run_dir)
    assert {w["name"]: w["restarts"] for w in status["workers"] if w["restarts"]} == \
        {"evaluator-0": 1}


def test_a_server_restarted_on_a_new_port_is_followed_by_its_clients(
        processes: Processes, tmp_path: Path) -> None:
    """As when Ray restarts a worker on another node: its endpoint changes, and the
    actors, which looked it up once, must find it again through the name service.
    Its old entry goes with it, so the successor cannot take the old port back."""
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              "stop.wall_time_s=600", "runtime.restart_backoff_s=1",
                              "actors.inference_timeout_s=1")
    wait_for(lambda: all_running(run_dir), 90, "all workers running")
    names = FileNameService(run_dir / "names")
    key = INFERENCE.key(index=0)
    old = names.get(key)
    victim = worker(read_status(run_dir), "inference-0")["pid"]
    Processes.kill(victim)
    names.unregister(key)
    wait_restarted(run_dir, "inference-0", victim, 60)
    assert names.get(key) not in (None, old), "the successor registered a new port"
    at_restart = read_metrics(run_dir)[-1]
    wait_for(lambda: read_metrics(run_dir)[-1]["env_frames"] > at_restart["env_frames"] + 20000,
             60, "actors served by the successor")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130, (tmp_path / "launch.log").read_text()
    for actor in ("actor-0", "actor-1"):
        assert f"'{key}' moved from" in (run_dir / "logs" / f"{actor}.log").read_text()
