"""Population-based training end to end: one run of four CartPole members, two of them
hopeless, ranked by the evaluator's returns, with a member's learner killed mid-run,
then a resume of the same run.

The manager runs as on a host that shares no directory with the learners or the
controller (`SRL_JAX_APART`, with the network name service): its scores come as metrics
rows over the network, its exploits go to the learners over the control stream, the
lineage it starts from comes from the controller, and the learners' copies land in
`population.jsonl` on the controller's side; its own folder stays empty.
"""

from __future__ import annotations

import ast
import os
import signal
import sys
from pathlib import Path

import pytest
import zmq

from srl_jax.config.population import read_lineage
from srl_jax.dataflow.stream_table import CONTROL
from srl_jax.runtime.backends import APART_ENV
from srl_jax.runtime.run_dir import evaluated_root, steps_in
from srl_jax.wire.streams import RejectCounter, receive, send
from tests.conftest import (
    CARTPOLE_MARGIN,
    CARTPOLE_RANDOM_RETURN,
    Processes,
    ended_on_frames,
    launch,
    read_status,
    wait_for,
    wait_restarted,
    worker,
)

pytestmark = pytest.mark.slow
LR = "learner.ppo.learning_rate"
HOPELESS = ("m2", "m3")
MEMBERS = ("m0", "m1", "m2", "m3")
FRAMES = 500_000
"""The run's frame budget, all members' together: there each member's best mean return of 5
windows was 257-494 (3 runs on 2 cores under others' load), the hopeless members' through
the winners they copied (both had by 220,000 frames, once). It used to stop at every
member's return at 300 at once (at 710,000 frames once, without the kill)."""


def restores(logs: Path, member: str) -> int:
    """How often the member's learner has restored a checkpoint of its own."""
    return (logs / f"learner-{member}-0.log").read_text().count("restored checkpoint step")


def learner_pid(run_dir: Path, member: str) -> int | None:
    found = worker(read_status(run_dir), f"learner-{member}-0")
    return found["pid"] if found and found["state"] == "running" else None


def malformed_exploits_refused(run_dir: Path, member: str) -> int:
    """Send a member's learner an exploit naming no member, and one undecodable message:
    the first is answered as refused, both are counted and dropped; how many were sent."""
    ports = worker(read_status(run_dir), f"learner-{member}-0")["ports"]
    endpoint = next(port["endpoint"] for port in ports if port["key"] == CONTROL.key(member))
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        send(dealer, "exploit", {"member": member, "donor": "m9", "hyperparams": {LR: 1.0},
                                 "old_hyperparams": {}, "scores": {}})
        dealer.send_multipart([b"\xc1 not a message"])
        assert dealer.poll(30_000), "the learner answers a malformed exploit"
        answer = receive(dealer, CONTROL.connecter_receives, RejectCounter())
        assert answer is not None and answer[1].meta == {
            "member": member, "ok": False, "reason": "malformed exploit"}
    finally:
        dealer.close()
        context.term()
    return 2


def best_member_return(rows: list[dict], member: str, windows: int = 5) -> float:
    """The member's best mean return of `windows` consecutive windows that had episodes of
    it (rows hold no rolling mean of a member's own)."""
    returns = [r[f"policy/{member}/episode_return_mean"] for r in rows
               if f"policy/{member}/episode_return_mean" in r]
    assert len(returns) >= windows, (member, returns)
    return max(sum(returns[i:i + windows]) / windows for i in range(len(returns) - windows + 1))


def test_losers_copy_winners_live_and_the_population_survives_a_dead_learner_and_resumes(
        processes: Processes, tmp_path: Path) -> None:
    manager_host = tmp_path / "hosts" / "population-0"
    manager_host.mkdir(parents=True)
    apart = {APART_ENV: str(manager_host.parent)}
    process, run_dir = launch(
        processes, tmp_path, "runtime.names=network",
        f"population.initial={{{LR}: [1.0e-3, 1.0e-3, 1.0e-7, 1.0e-7]}}",
        "population.ready_after_updates=15", "stop.target_return=null",
        f"stop.env_frames={FRAMES}",
        "evaluation.every_updates=10", "evaluation.episodes=2",  # members ranked by it
        # Each member's actor runs its policy itself: what is tested is the population, and
        # four inference servers more on 2 cores slow every member (resumed so too).
        "actors.inline_inference=true",
        experiment="cartpole_ppo_pbt", env=apart)
    pids = wait_for(lambda: all(learner_pid(run_dir, m) for m in HOPELESS) and
                    {m: learner_pid(run_dir, m) for m in HOPELESS}, 120, "learners running")
    wait_for(lambda: read_lineage(run_dir), 120, "a first exploit")
    assert malformed_exploits_refused(run_dir, "m0") == 2
    victim = learner_pid(run_dir, "m1")
    os.kill(victim, signal.SIGKILL)
    wait_restarted(run_dir, "learner-m1-0", victim, 90)
    rows, status = ended_on_frames(process, run_dir, FRAMES, tmp_path / "launch.log", 240)
    for member in MEMBERS:  # the hopeless ones through the winners they copied
        assert best_member_return(rows, member) >= CARTPOLE_RANDOM_RETURN + CARTPOLE_MARGIN
    lineage = read_lineage(run_dir)
    copied = {event["member"] for event in lineage}
    assert set(HOPELESS) <= copied, "both hopeless members were replaced"
    for event in lineage:  # losers copy winners: the donor outscored the member when it copied
        assert event["donor"] != event["member"] and event["donor_step"] > 0
        assert set(event["scores"]) == set(MEMBERS)
        assert event["scores"][event["donor"]] > event["scores"][event["member"]], event
    last = {event["member"]: event for event in lineage}
    assert all(last[m]["hyperparams"][LR] > 1e-6 for m in HOPELESS), \
        "each hopeless member ends with a learner's values (an early copy may come from a " \
        "hopeless member that still ranked above it on a 2-episode evaluation)"
    first = {m: next(e for e in lineage if e["member"] == m) for m in HOPELESS}
    assert all(first[m]["old_hyperparams"][LR] == 1e-7 for m in HOPELESS)
    for member, pid in pids.items():  # copied live: the same process, never restarted
        record = worker(status, f"learner-{member}-0")
        assert record["pid"] == pid and record["restarts"] == 0, record
        log = (run_dir / "logs" / f"learner-{member}-0.log").read_text()
        assert f"copied {first[member]['donor']}'s step {first[member]['donor_step']}" in log
    # A copy the manager hears of after its last report is in the lineage, not its count.
    assert 0 <= len(lineage) - rows[-1]["population/exploits"] <= len(MEMBERS)
    assert rows[-1]["system/wire_rejected"] == 2, "only the two malformed messages"
    for member in MEMBERS:  # the evaluator evaluates each member on its own
        assert any(f"policy/{member}/eval_return_mean" in r for r in rows), member
        assert steps_in(evaluated_root(run_dir, member)), member
    assert any(f"learner/{m}/hp/learning_rate" in r for r in rows for m in HOPELESS)

    # Resume: every member continues from its own checkpoint with its current values, and
    # the manager from the lineage so far.
    logs = run_dir / "logs"
    before = {m: restores(logs, m) for m in MEMBERS}  # m1's restart restored one already
    resumed = processes.start(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo_pbt", "--run-dir", str(run_dir),
         "--resume", "--set", "stop.env_frames=0",  # past its budget: on until Ctrl-C
         "--set", "evaluation.every_updates=0"],  # no evaluator: only restores are checked
        log=tmp_path / "resume.log", env=apart)
    wait_for(lambda: f"{len(lineage)} exploit events so far" in
             (logs / "population-0.log").read_text().rsplit("population-0: 4 members", 1)[-1]
             and all(restores(logs, m) > before[m] for m in MEMBERS), 120,
             "the manager and every member resumed")
    resumed.send_signal(signal.SIGINT)
    assert resumed.wait(timeout=60) == 130, (tmp_path / "resume.log").read_text()
    for member in HOPELESS:
        current = [e["hyperparams"] for e in lineage if e["member"] == member][-1]
        log = (logs / f"learner-{member}-0.log").read_text()
        resumed_part = log.rsplit("restored checkpoint step", 1)[1]
        shown = ast.literal_eval(resumed_part.split("hyperparameters ", 1)[1].splitlines()[0])
        assert shown["learning_rate"] == pytest.approx(current[LR], rel=1e-6)
        assert shown["ent_coef"] == pytest.approx(current["learner.ppo.ent_coef"], rel=1e-6)
    # The manager's host: nothing of the run there, its output all on the controller's.
    assert sorted(p.name for p in manager_host.iterdir()) == ["launcher.log", "scratch"]
    assert not any((manager_host / "scratch").iterdir())
    assert (manager_host / "launcher.log").read_text() == ""
