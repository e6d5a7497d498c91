"""The controller's side of a population run, so that neither the population manager nor
the learners need the run directory: a cluster's hosts may share no disk.

The controller binds two streams for it (srl_jax/dataflow/stream_table.py):

- rows: each metrics row, as `metrics.jsonl` gets it, published to the manager, which
  ranks the members by them (a PUB: a manager that is starting misses the rows before
  its subscription, and ranks from the next ones);
- lineage: a member's learner sends each copy it made (`lineage_event`, once its
  checkpoint of the copy is complete); the link appends it to `population.jsonl` in the
  controller's run directory and acknowledges it (`lineage`, the event's `id` and the
  count). A manager that starts (restarted, or in a resumed run) asks for the copies
  so far (`lineage_request`, answered with the file's lines), so it needs no state of
  its own.

The lineage is served from a thread of its own, as the names and the logs are: a copy
answered while the controller stops its workers is still recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from srl_jax.config.population import append_lineage, event_problem, lineage_line, read_lineage
from srl_jax.config.schema import ExperimentConfig, member_names
from srl_jax.dataflow.stream_table import LINEAGE, ROWS
from srl_jax.dataflow.worker_kinds import worker_kind
from srl_jax.wire.names import NameService
from srl_jax.wire.streams import NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import Transport

ROWS_QUEUE = 64
"""Rows queued towards a manager that is behind (then it misses rows, never blocks us)."""
POLL_MS = 50


def text_array(text: str) -> np.ndarray:
    """Text as the wire carries it: uint8 bytes (a long lineage outgrows a header)."""
    return np.frombuffer(text.encode(), np.uint8)


class PopulationLink:
    """The rows the manager ranks by, and the lineage in the controller's run directory."""

    def __init__(self, transport: Transport, names: NameService, run_dir: Path,
                 members: Iterable[str]) -> None:
        self.rejects = RejectCounter()
        self._run_dir = Path(run_dir)
        self._members = list(members)
        self._events = read_lineage(run_dir)
        """Every copy so far (a resumed run's too), as appended."""
        self._rows = make_socket(transport.context, ROWS.bind_type, hwm=ROWS_QUEUE)
        transport.bind(self._rows, names, ROWS.key())
        self._socket = make_socket(transport.context, LINEAGE.bind_type)
        transport.bind(self._socket, names, LINEAGE.key())
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="population-link",
                                        daemon=True)
        self._thread.start()

    def publish(self, line: str) -> None:
        """Send a metrics row's JSON line to the manager (from the controller's loop only:
        `MetricsWriter` calls it with each row it writes)."""
        send(self._rows, "metrics_row", {}, {"row": text_array(line)}, flags=NOBLOCK)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop serving the lineage (after the workers are gone) and close both streams."""
        self._stopping.set()
        self._thread.join(timeout_s)
        self._rows.close(linger=0)

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._socket.poll(POLL_MS):
                    self._answer()
        finally:
            self._socket.close(linger=0)

    def _answer(self) -> None:
        while (received := receive(self._socket, LINEAGE.binder_receives, self.rejects,
                                   envelope=1)) is not None:
            routing, message = received
            reply: dict[str, Any] = {"id": message.meta.get("id")}
            arrays = None
            event: Any = message.meta.get("event")  # wire data, checked by event_problem
            if message.kind == "lineage_request":
                arrays = {"events": text_array("".join(map(lineage_line, self._events)))}
            elif problem := event_problem(event, self._members):
                self.rejects.reject(ValueError(f"lineage event refused: {problem}"))
                reply["error"] = problem
            else:
                append_lineage(self._run_dir, event)
                self._events.append(event)
            send(self._socket, "lineage", {**reply, "count": len(self._events)}, arrays,
                 routing=routing)


def population_link(config: ExperimentConfig, transport: Transport, names: NameService,
                    run_dir: Path) -> PopulationLink | None:
    """The run's link, where it has a population manager (None otherwise)."""
    if not worker_kind("population").count(config):
        return None
    return PopulationLink(transport, names, run_dir, member_names(config.population.members))

