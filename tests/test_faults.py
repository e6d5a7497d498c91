"""Failure injection: workers that raise inside their loop, keep failing, or freeze.

The faults are real: an environment that raises in the actor's loop (the way a
buggy or crashing env does), any worker raising from its loop (srl_jax/runtime/faults.py),
SIGSTOP and SIGKILL. Two runs take their faults one after another, each recovery
observed (a successor running, the run training on) before the next fault, and end
on Ctrl-C: a frame limit could come before a successor does. Past the retry budget a
run ends with one line, a non-zero exit and a final checkpoint. A server restarted on
a new port is found again through the name service. Kills of every worker kind are in
tests/test_run.py and tests/test_resume.py; a stopped server that comes back in
tests/test_status.py.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from pathlib import Path

import gymnasium as gym
import pytest

from actors.actor_worker import split_seeds
from srl_jax.dataflow.stream_table import INFERENCE
from srl_jax.runtime.faults import FAULTS_ENV, FaultPlan, InjectedFault
from srl_jax.runtime.incarnation import FIRST, Incarnation
from srl_jax.runtime.run_dir import checkpoint_steps, read_run_config
from srl_jax.wire.names import FileNameService
from srl_jax.wire.shm import place
from tests.conftest import (
    REPO,
    Processes,
    all_running,
    interrupt,
    launch,
    logged_env_seeds,
    pid_alive,
    read_metrics,
    read_status,
    shm_dir,
    wait_for,
    wait_restarted,
    worker,
)

FAULTY_ID = "FaultyCartPole-v1"
SMALL = ("actors.envs=4", "actors.splits=2", "learner.batch_envs=8", "inference.max_batch=8",
         "stop.target_return=null", "runtime.restart_backoff_s=0.2")
UNTIL_CTRL_C = ("stop.wall_time_s=600", "checkpoint.every_updates=5",
                "actors.inference_timeout_s=1")
"""No frame limit: the actors outrun a frozen or restarting learner, and training does
not wait for the evaluator, so a limit could end the run before a successor works."""
HEARTBEAT_TIMEOUT_S = 5
"""A frozen worker is killed after this long (the default 60 s, scaled down): each of the
run's two freezes waits it out, and ten heartbeats (every 0.5 s, from a helper thread
through compiles) fit in it; a successor gets twice that for its first."""


class FaultyCartPole(gym.Wrapper):
    """CartPole that raises on step `after` and every step after while the file `fault`
    exists, as a crashing env does: the actor fails again each time it is restarted."""

    def __init__(self, fault: str, after: int) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fault, self.after, self.steps = Path(fault), after, 0

    def step(self, action):
        self.steps += 1
        if self.steps >= self.after and self.fault.exists():
            raise RuntimeError(f"injected fault at step {self.steps}")
        return super().step(action)


if FAULTY_ID not in gym.envs.registry:
    gym.register(FAULTY_ID, entry_point=FaultyCartPole)


@pytest.fixture
def repo_importable(monkeypatch):
    """Workers import this module (for the faulty env) from the repository root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))


def faulty(fault: Path, after: int) -> list[str]:
    return [f"env.id={__name__}:{FAULTY_ID}", f"env.kwargs={{fault: '{fault}', after: {after}}}"]


def trains_on(run_dir: Path, what: str) -> dict:
    """Wait for new frames and more than 5 updates after now; the last row then."""
    at = read_metrics(run_dir)[-1]
    return wait_for(lambda: (row := read_metrics(run_dir)[-1])["env_frames"] > at["env_frames"]
                    and row["learner_steps"] > at["learner_steps"] + 5 and row, 120, what)


def restarts(run_dir: Path) -> dict[str, int]:
    return {w["name"]: w["restarts"] for w in read_status(run_dir)["workers"] if w["restarts"]}


def test_a_fault_file_put_later_makes_the_worker_raise_at_its_time(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(FAULTS_ENV, str(tmp_path))
    plan = FaultPlan("learner-0")
    plan.check()  # no file: nothing
    (tmp_path / "learner-0").write_text("0.5")
    started = time.monotonic()
    with pytest.raises(InjectedFault, match=r"injected by .*learner-0 after 0\.\ds of running"):
        while time.monotonic() - started < 5:
            plan.check()
    assert time.monotonic() - plan.started >= 0.5
    assert not (tmp_path / "learner-0").exists(), "the successor runs on"
    plan.check()


@pytest.mark.slow
def test_workers_that_raise_or_freeze_are_replaced_and_lose_nothing_saved(
        processes: Processes, tmp_path: Path) -> None:
    """An actor, the learner, the inference server and the evaluator raise in their loop,
    one after another; then an actor and the server freeze (SIGSTOP) together, then the
    learner: each is killed at the heartbeat timeout and replaced, and the run trains on
    after each. One run for both, as each start costs the suite's 2 cores some 10 s. (An
    env that raises in the actor's loop: the test below.)"""
    faults = tmp_path / "faults"
    faults.mkdir()
    process, run_dir = launch(processes, tmp_path, *SMALL, *UNTIL_CTRL_C,
                              "evaluation.every_updates=5", "evaluation.episodes=2",
                              f"runtime.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
                              env={FAULTS_ENV: str(faults)})
    wait_for(lambda: all_running(run_dir), 90, "all workers running")

    # An actor raises: restarted, its envs seeded anew, reproducibly.
    raise_in_loop(run_dir, faults, "actor-0")
    config, restarted = read_run_config(run_dir), Incarnation(0, 1)
    assert logged_env_seeds(run_dir, 0) == {
        start: split_seeds(config, 0, start) for start in (FIRST, restarted)}
    assert logged_env_seeds(run_dir, 1) == {FIRST: split_seeds(config, 1, FIRST)}
    seeds = logged_env_seeds(run_dir, 0)
    assert set(itertools.chain(*seeds[FIRST])).isdisjoint(itertools.chain(*seeds[restarted]))

    # The warm parent is killed: what it forked runs on, and the learner's successor below
    # is forked by another. The learner raises: its successor goes on from the checkpoint,
    # not from scratch.
    killed = read_status(run_dir)["warm_parents"][0]["pid"]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: checkpoint_steps(run_dir), 60, "the learner's first checkpoint")
    raise_in_loop(run_dir, faults, "learner-0")
    log = (run_dir / "logs" / "learner-0.log").read_text()
    restored = int(re.search(r"restored checkpoint step (\d+)", log).group(1))
    assert restored >= 5, "the successor went on from the checkpoint, not from scratch"
    warm = read_status(run_dir)["warm_parents"][0]
    assert warm["starts"] == 2 and warm["pid"] != killed and warm["alive"], warm
    assert restarts(run_dir) == {"actor-0": 1, "learner-0": 1}, "the rest ran on"

    # The server raises, and its old entry goes with it, as when Ray restarts a worker on
    # another node: the successor binds a new port (not the old one back) and the actors,
    # which looked it up once, find it again through the name service.
    names, key = FileNameService(run_dir / "names"), INFERENCE.key(index=0)
    old = names.get(key)
    names.unregister(key)
    raise_in_loop(run_dir, faults, "inference-0")
    assert names.get(key) not in (None, old), "the successor registered a new port"
    for actor in ("actor-0", "actor-1"):
        wait_for(lambda log=run_dir / "logs" / f"{actor}.log": f"'{key}' moved from"
                 in log.read_text(), 60, f"{actor} following the server to its new port")

    # The evaluator raises: its successor evaluates again.
    successor = raise_in_loop(run_dir, faults, "evaluator-0", trains=False)
    evaluated = len([r for r in read_metrics(run_dir) if "eval_return_mean" in r])
    wait_for(lambda: len([r for r in read_metrics(run_dir) if "eval_return_mean" in r])
             > evaluated, 120, "an evaluation by the successor")
    assert pid_alive(successor["pid"])
    log = (run_dir / "logs" / "evaluator-0.log").read_text()
    assert log.count(": running\n") == 2, "both evaluators ran"

    # They freeze: killed at the heartbeat timeout, the learner's successor restoring
    # the checkpoint again.
    frozen = ("actor-0", "inference-0", "learner-0")
    for names in (frozen[:2], frozen[2:]):
        victims = {name: worker(read_status(run_dir), name)["pid"] for name in names}
        for victim in victims.values():
            os.kill(victim, signal.SIGSTOP)
        for name, victim in victims.items():
            wait_restarted(run_dir, name, victim, 120, restarts=2)
        trains_on(run_dir, f"training after {' and '.join(names)} were replaced")
    # Their requests and chunks went through shared memory, and the slots of the actor
    # killed went with it (its successor removed them).
    directory = shm_dir(run_dir)
    slots = [int(path.name.split(".")[-2], 16) for path in directory.glob("*.slots")]
    assert len(slots) == 4 and all(place.alive(directory, token) for token in slots), \
        slots  # 2 actors x 2

    interrupt(process, tmp_path / "launch.log")
    assert not directory.exists(), "the controller removed its shared memory"
    log = (run_dir / "logs" / "controller.log").read_text()
    for name in frozen:
        assert re.search(rf"no heartbeat from {name} for \d+s; killing it", log), name
    assert (run_dir / "logs" / "learner-0.log").read_text().count(
        "restored checkpoint step") == 2
    assert restarts(run_dir) == {**dict.fromkeys(frozen, 2), "evaluator-0": 1}
    assert read_metrics(run_dir)[-1]["system/restarts"] == 7


def raise_in_loop(run_dir: Path, faults: Path, name: str, trains: bool = True) -> dict:
    """Make worker `name` raise from its loop; wait for its successor (and, with `trains`,
    for the run to train on after it); the successor's record."""
    victim = worker(read_status(run_dir), name)["pid"]
    (faults / name).write_text("0")
    successor = wait_restarted(run_dir, name, victim, 90)
    assert not (faults / name).exists(), "the fault fired once"
    assert "srl_jax.runtime.faults.InjectedFault: injected by" in \
        (run_dir / "logs" / f"{name}.log").read_text()
    if trains:
        trains_on(run_dir, f"training after {name} restarted")
    return successor


@pytest.mark.slow
def test_an_env_that_keeps_failing_ends_the_run_with_one_line_and_a_checkpoint(
        processes: Processes, tmp_path: Path, repo_importable) -> None:
    fault = tmp_path / "fault"
    fault.touch()
    process, run_dir = launch(processes, tmp_path, *SMALL, *faulty(fault, 150),
                              "runtime.max_restarts=2", "stop.env_frames=1000000",
                              "checkpoint.every_updates=1")
    assert process.wait(timeout=120) == 1, (tmp_path / "launch.log").read_text()
    last = (tmp_path / "launch.log").read_text().strip().splitlines()[-1]
    assert re.fullmatch(r"failed: actor-\d exited with code 1 after 2 restarts; see "
                        rf"{re.escape(str(run_dir))}/logs/actor-\d\.log \(run directory: "
                        rf"{re.escape(str(run_dir))}\)", last), last
    final = read_status(run_dir)
    assert final["state"] == "failed"
    failed = next(w for w in final["workers"] if w["state"] == "failed")
    assert failed["kind"] == "actor" and failed["restarts"] == 2
    log = (run_dir / "logs" / f"{failed['name']}.log").read_text()
    assert log.count("RuntimeError: injected fault at step 150") == 3, "each start failed"
    learner = worker(final, "learner-0")
    assert learner["state"] == "stopped" and learner["exit_code"] == 0, "stopped, not killed"
    assert checkpoint_steps(run_dir), "the learner's final checkpoint"
