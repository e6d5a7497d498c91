"""The run's last metrics row takes what workers finished while the run stopped.

An evaluation that ends right at the stop is saved, and the evaluator's heartbeat that
carries it leaves as the evaluator exits: it can still be on its way when the controller
sees the exit. The controller's real stop sequence runs here against scripted workers
(a backend whose workers are no processes), so that this heartbeat arrives only after
the exit, every time: no timing luck either way.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from srl_jax.config.loader import load_config
from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.stream_table import STATS
from srl_jax.runtime import supervisor
from srl_jax.runtime.backends import WorkerHandle
from srl_jax.runtime.controller import Controller
from srl_jax.runtime.run_dir import read_metrics
from srl_jax.runtime.supervisor import EXIT_OK, LAST_HEARTBEAT_S
from srl_jax.runtime.worker_base import LAST_PHASE
from srl_jax.wire.names import FileNameService, NameService, worker_name
from srl_jax.wire.streams import make_socket, send
from tests.conftest import REPO

LATE_S = 0.5
"""How long after its exit the evaluator's last heartbeat leaves."""
EVALUATED = {"eval_return": np.asarray([470.0, 480.0], np.float32)}
"""The evaluation that finished at the stop: two deterministic episodes."""


class ScriptedWorker:
    """One worker: a stats socket, and an exit code once it is told to stop."""

    def __init__(self, name: str, kind: str, index: int, pid: int, endpoint: str) -> None:
        self.name, self.kind, self.index, self.pid = name, kind, index, pid
        self.socket = make_socket(zmq.Context.instance(), STATS.connect_type)
        self.socket.connect(endpoint)
        self.code: int | None = None

    def heartbeat(self, phase: str, counters: dict[str, float],
                  arrays: dict[str, np.ndarray] | None = None) -> None:
        send(self.socket, "stats", {
            "worker": self.name, "kind": self.kind, "index": self.index,
            "policy": DEFAULT_POLICY, "pid": self.pid, "host": "here", "phase": phase,
            "counters": counters, "ports": [], "waiting": None}, arrays or {})


class ScriptedBackend:
    """Starts scripted workers that report at once. On SIGTERM each exits at once; its
    last heartbeat leaves before it exits, but the evaluator's (with the evaluation
    it finished at the stop) `LATE_S` after, and a worker named in `silent` sends none."""

    def __init__(self, run_dir: Path, silent: tuple[str, ...] = ()) -> None:
        self.names = FileNameService(run_dir / "names")
        self.silent = silent
        self.pids = itertools.count(1_000_000)
        self.workers: list[ScriptedWorker] = []
        self.late: list[threading.Thread] = []

    def name_service(self) -> NameService:
        return self.names

    def bind_host(self) -> str | None:
        return None

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY,
              env: dict[str, str] | None = None) -> WorkerHandle:
        endpoint = self.names.lookup(STATS.key(), timeout_s=10)
        worker = ScriptedWorker(worker_name(kind, index, policy), kind, index,
                                next(self.pids), endpoint)
        worker.heartbeat("running", self.counters(kind, evaluated=False))
        self.workers.append(worker)
        return WorkerHandle(kind, index, worker.pid, "here", worker, policy)

    @staticmethod
    def counters(kind: str, evaluated: bool) -> dict[str, float]:
        if kind != "evaluator":
            return {}
        return {"evaluations": int(evaluated), "eval_episodes": 2 * int(evaluated),
                "eval_version": 20 if evaluated else -1}

    def placement_wait(self, kind: str) -> str:
        return "nothing"

    def ports(self) -> list[dict[str, Any]]:
        return []

    def shared_memory_dir(self) -> str | None:
        return None

    def warm_parents(self) -> list[dict[str, Any]]:
        return []

    def exit_code(self, handle: WorkerHandle) -> int | None:
        return handle.ref.code

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        worker: ScriptedWorker = handle.ref
        assert sig == signal.SIGTERM and worker.code is None, "a clean stop"
        if worker.kind == "evaluator":
            def send_late() -> None:
                time.sleep(LATE_S)
                worker.heartbeat(LAST_PHASE, self.counters(worker.kind, evaluated=True),
                                 EVALUATED)
            self.late.append(threading.Thread(target=send_late))
            self.late[-1].start()
        elif worker.name not in self.silent:
            worker.heartbeat(LAST_PHASE, self.counters(worker.kind, evaluated=False))
        worker.code = 0

    def close(self) -> None:
        for thread in self.late:
            thread.join()
        for worker in self.workers:
            worker.socket.close(linger=1000)


def stopped_run(run_dir: Path, silent: tuple[str, ...] = ()) -> tuple[Controller, float]:
    """A run with an evaluator, stopped by its wall-time limit; the controller and the
    seconds between the row that stopped the run and the last one (the stop sequence)."""
    config = load_config(REPO / "configs" / "cartpole_ppo.yaml", [
        "evaluation.every_updates=10", "stop.target_return=null", "stop.wall_time_s=0.3",
        "runtime.log_interval_s=0.1"])
    controller = Controller(config, run_dir, ScriptedBackend(run_dir, silent))
    assert controller.run() == EXIT_OK, controller.stop_reason
    assert controller.stop_reason.startswith("wall time"), controller.stop_reason
    rows = read_metrics(run_dir)
    return controller, rows[-1]["time"] - rows[-2]["time"]


def test_an_evaluation_that_ends_at_the_stop_reaches_the_last_row(tmp_path: Path) -> None:
    controller, took = stopped_run(tmp_path)
    rows = read_metrics(tmp_path)
    evaluated = [row for row in rows if "eval_return_mean" in row]
    assert evaluated == [rows[-1]], "the evaluation is in the last row, and only there"
    assert rows[-1]["eval_return_mean"] == 475.0 and rows[-1]["eval_policy_version"] == 20
    assert LATE_S <= took < LAST_HEARTBEAT_S, "waited for it, and for nothing else"
    assert all(record.state == "stopped" for record in controller.workers)


def test_a_last_heartbeat_that_never_comes_is_waited_for_a_bounded_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    bound = 2 * LATE_S
    monkeypatch.setattr(supervisor, "LAST_HEARTBEAT_S", bound)
    with caplog.at_level(logging.WARNING, logger="controller"):
        _, took = stopped_run(tmp_path, silent=("actor-0",))
    assert bound <= took < bound + 2.0
    assert f"no last heartbeat from actor-0 within {bound:.0f}s of its exit" in caplog.text
    assert read_metrics(tmp_path)[-1]["eval_return_mean"] == 475.0
