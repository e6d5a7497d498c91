"""A worker that refuses the run (exit code EXIT_REFUSED) ends it; other exits restart it."""

from __future__ import annotations

from pathlib import Path

import zmq

from srl_jax.config.loader import load_config
from srl_jax.dataflow.worker_kinds import EXIT_REFUSED
from srl_jax.runtime.backends import LocalBackend, WorkerHandle
from srl_jax.runtime.controller import Controller
from srl_jax.wire.transport import Transport
from tests.conftest import REPO


def exited(tmp_path: Path, code: int, lost: str | None = None) -> Controller:
    """A controller whose learner's process has just exited with `code`."""
    config = load_config(REPO / "configs" / "cartpole_ppo.yaml")
    controller = Controller(config, tmp_path, LocalBackend(tmp_path))
    controller.transport = Transport(zmq.Context.instance())  # what `run` binds with
    record = next(r for r in controller.workers if r.kind == "learner")
    record.handle = WorkerHandle("learner", 0, pid=0, host="here", ref=None, lost=lost)
    controller.supervisor.on_exit(record, code, f"exited with code {code}")
    return controller


def test_a_refusal_ends_the_run_naming_the_worker_and_its_log(tmp_path: Path) -> None:
    controller = exited(tmp_path, EXIT_REFUSED)
    learner = next(r for r in controller.workers if r.kind == "learner")
    assert learner.state == "failed" and learner.restarts == 0
    failure = controller.supervisor.failure
    assert failure is not None and failure.startswith(
        "learner-0 refused the run (a restart would refuse it again); see ")
    assert failure.endswith("logs/learner-0.log")


def test_a_crash_or_a_lost_host_is_restarted_whatever_its_code(tmp_path: Path) -> None:
    for code, lost in ((1, None), (EXIT_REFUSED, "node left the cluster")):
        controller = exited(tmp_path / str(code), code, lost)
        learner = next(r for r in controller.workers if r.kind == "learner")
        assert learner.state == "restarting" and learner.restarts == 1, (code, lost)
        assert controller.supervisor.failure is None
