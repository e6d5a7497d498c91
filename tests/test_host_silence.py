"""A host whose workers all go silent at once lost its agent or its link, not its workers:
the supervisor kills and restarts each of them as lost with the host (one preemption, as a
Ray node that leaves), not charged a fault; a worker silent alone is charged as before.

The supervisor runs here against real processes (`sleep`) on two named hosts; the test
stands in for the controller and says when each worker last heartbeated."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.runtime.backends import WorkerHandle
from srl_jax.runtime.metrics import MetricsAggregator
from srl_jax.runtime.supervisor import Supervisor
from srl_jax.runtime.worker_records import StartupTimeline, WorkerRecord
from srl_jax.wire.names import FileNameService, NameService
from tests.conftest import make_config

TIMEOUT_S = 5.0


class SleepingBackend:
    """Each worker a `sleep` process; actors 0-2 on host 'a', the rest on host 'b'."""

    def __init__(self, run_dir: Path) -> None:
        self.names = FileNameService(run_dir / "names")
        self.processes: list[subprocess.Popen] = []

    def name_service(self) -> NameService:
        return self.names

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY,
              env: dict[str, str] | None = None) -> WorkerHandle:
        process = subprocess.Popen(["sleep", "600"])
        self.processes.append(process)
        return WorkerHandle(kind, index, process.pid, "a" if index < 3 else "b", process,
                            policy)

    def placement_wait(self, kind: str) -> str:
        return "nothing"

    def exit_code(self, handle: WorkerHandle) -> int | None:
        return handle.ref.poll()

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        handle.ref.send_signal(sig)

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def test_a_host_gone_silent_restarts_its_workers_as_lost_and_a_lone_silence_is_a_fault(
        tmp_path: Path) -> None:
    config = make_config([f"runtime.heartbeat_timeout_s={TIMEOUT_S}", "actors.count=5",
                          "runtime.restart_backoff_s=0"])
    backend = SleepingBackend(tmp_path)
    records = [WorkerRecord("actor", index) for index in range(5)]
    supervisor = Supervisor(config, tmp_path, backend, records, MetricsAggregator(),
                            StartupTimeline(time.time()), backend.names)
    try:
        for record in records:
            supervisor.start(record)
        now = time.monotonic()
        for record, silent in zip(records, (True, True, True, True, False), strict=True):
            record.state = "running"  # host a all silent; on b, actor-3 alone
            record.last_heartbeat = now - (2 * TIMEOUT_S if silent else 0.0)
        first = {record.name: record.process.pid for record in records}
        deadline = time.monotonic() + 10
        while any(r.state == "running" and r.handle.pid == first[r.name] for r in records[:4]):
            assert time.monotonic() < deadline, [r.state for r in records]
            supervisor.watch()
            time.sleep(0.02)
        lost = {r.name: (r.restarts, r.losses) for r in records}
        assert lost == {"actor-0": (1, 1), "actor-1": (1, 1), "actor-2": (1, 1),
                        "actor-3": (1, 0), "actor-4": (0, 0)}, lost
        for _ in range(3):  # restarted at once: lost, or no backoff
            supervisor.watch()
        assert all(r.handle.pid != first[r.name] for r in records[:4])
        assert records[4].handle.pid == first["actor-4"]
    finally:
        backend.close()
