"""The plan (srl_jax/dataflow/plan.py): `--plan` prints the workers, streams and transports
of a config and starts nothing; the plan follows each config's choices; and it agrees with
what a real run's workers bind (test_status.py's run checks `bound_keys` against it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from srl_jax.dataflow.plan import CONTROLLER, Carriers, Plan, make_plan
from tests.conftest import make_config


def bound_keys(plan: Plan) -> set[str]:
    """The name-service keys the plan's workers bind: one per binder of each link."""
    counts = {(w.kind, w.policy): w.count for w in plan.workers}
    keys = set()
    for link in plan.links:
        if link.stream.binder == CONTROLLER:
            continue
        binders = counts[link.stream.binder, link.policy]
        keys |= {link.stream.key(link.policy, i) for i in range(binders)} \
            if link.stream.indexed else {link.stream.key(link.policy)}
    return keys


def _streams(plan: Plan) -> dict[str, tuple[tuple[str, ...], str]]:
    return {link.stream.name: (link.connecters, link.transport) for link in plan.links}


def test_plan_prints_the_default_run_and_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--plan", "--run-dir",
         str(run_dir), "--set", "transport.shared_memory=off"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "srl_jax: plan of cartpole_ppo (local backend, this host)"
    assert any(line.split()[:2] == ["learner", "x1"] for line in lines)
    samples = next(line for line in lines if line.split()[0] == "samples")
    assert samples.split()[1:4] == ["actor", "->", "learner"]
    assert samples.endswith("ZeroMQ TCP, loopback")
    assert not run_dir.exists()


def test_the_plan_follows_the_algorithms_source_and_the_carriers() -> None:
    ppo = _streams(make_plan(make_config(), Carriers(shared_memory=True)))
    assert ppo["samples"] == (("actor",), "shared memory")
    assert ppo["inference"] == (("actor",), "shared memory")
    assert ppo["params"] == (("inference",), "ZeroMQ TCP, loopback")
    assert "inserts" not in ppo and "names" not in ppo

    dqn = _streams(make_plan(make_config(experiment="cartpole_dqn"),
                             Carriers(network_names=True, curve=True)))
    assert dqn["inserts"] == (("actor",), "ZeroMQ TCP, CURVE")
    assert dqn["replay"][0] == ("learner",)
    assert "samples" not in dqn and "names" in dqn and "changes" in dqn

    inline = make_plan(make_config(["actors.inline_inference=true"]))
    assert _streams(inline)["params"][0] == ("actor",)
    assert "inference" not in _streams(inline)
    assert [w.entry for w in inline.workers if w.kind == "actor"] == [
        "policy.inline_policy:InlineActorWorker"]


def test_the_plan_of_self_play_and_a_population() -> None:
    selfplay = make_plan(make_config(experiment="rps_selfplay"))
    policies = {(link.stream.name, link.policy) for link in selfplay.links}
    frozen = make_config(experiment="rps_selfplay").selfplay.frozen
    assert all(("samples", policy) not in policies for policy in frozen)
    pbt = make_plan(make_config(experiment="cartpole_ppo_pbt"))
    streams = _streams(pbt)
    assert streams["control"][0] == ("population",)
    assert set(streams["lineage"][0]) == {"learner", "population"}
    assert "population" in streams["rows"][0]


def test_the_architecture_page_shows_the_plan_as_it_is_printed() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
    block = page.split("$ python -m srl_jax.launch cartpole_ppo --plan\n", 1)[1]
    shown = block.split("```", 1)[0].splitlines()
    plan = make_plan(make_config(), Carriers(shared_memory=True))
    assert shown == plan.lines()
