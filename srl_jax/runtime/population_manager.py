"""The population manager worker: ranks members, tells losers to copy winners (PBT).

It reads no file of the run directory, so it runs on any host of a cluster. It takes the
run's metrics rows from the controller (the rows stream), where every row carries each
member's return (or evaluation return, when the evaluator runs) and policy version
(`policy/<member>/...`), keeps a `MemberView` per member, and at each member's ready
point applies `srl_jax.config.population.decide`. An exploit goes to the loser's learner
over the control stream; the learner loads the donor's newest complete checkpoint,
takes the new hyperparameters without restarting, checkpoints the copy, has the
controller append the event to `population.jsonl` (so the lineage holds what a restart
would bring back) and answers with what it loaded. A member has one exploit in flight:
one unanswered for `REPLY_TIMEOUT_S` is sent again under its id (a learner that did it
answers again without copying twice). A manager that starts asks the
controller for the lineage so far (srl_jax/runtime/population_link.py) and ranks from
the rows that come after, so a restarted one needs no state of its own.
"""

from __future__ import annotations

import json
import time
from typing import Any

import zmq

from srl_jax.config.population import (
    VERSION_KEY,
    MemberView,
    decide,
    event_problem,
    initial_hyperparams,
    member_rng,
    member_score,
    parse_lineage,
    ranked_version,
    ranking_metric,
)
from srl_jax.config.schema import DEFAULT_POLICY, member_names
from srl_jax.dataflow.stream_table import CONTROL, LINEAGE, ROWS
from srl_jax.runtime.worker_base import LOOKUP_TIMEOUT_S, Worker, WorkerStopped
from srl_jax.wire.streams import ask, receive, send

POLL_MS = 200
ASK_S = 1.0
"""How long one ask for the lineage waits before the manager heartbeats and asks again."""
REPLY_TIMEOUT_S = 60.0
"""An exploit unanswered this long (its learner died, or a slow save) is sent again, the
same exploit under the same id: a member has one exploit in flight, never two."""
ROWS_KEPT = 10_000


class PopulationManager(Worker):
    kind = "population"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: dict[str, tuple[dict[str, Any], float, float]] = {}
        """Exploits sent, by member: (the message, monotonic and wall time first sent)."""
        self._resent: dict[str, float] = {}
        """When each pending exploit was last sent."""
        self._exploit_ids = 0
        self.exploits = 0
        self.refused = 0

    def setup(self) -> None:
        pop = self.config.population
        start = initial_hyperparams(self.config)
        self.views = {m: MemberView(m, start[m], ready_at=pop.ready_after_updates)
                      for m in member_names(pop.members)}
        events = self._lineage()
        for event in events:  # a restart or a resume: the lineage so far
            self._changed(event["member"], event["hyperparams"], event["version"])
        self.rng = member_rng(self.config, 1, len(events), self.incarnation.restarts,
                              self.incarnation.resumes)
        self.log.info("%d members; %d exploit events so far", len(self.views), len(events))
        self.sockets = {member: self.socket(CONTROL, member) for member in self.views}
        self.rows_in = self.socket(ROWS, DEFAULT_POLICY)
        self.poller = zmq.Poller()
        for socket in (*self.sockets.values(), self.rows_in):
            self.poller.register(socket, zmq.POLLIN)
        self.rows: list[dict[str, Any]] = []
        self.exploits = len(events)

    def _lineage(self) -> list[dict[str, Any]]:
        """The copies made so far, from the controller (asked again, heartbeating, until it
        answers or LOOKUP_TIMEOUT_S has passed)."""
        self.lineage = self.socket(LINEAGE, DEFAULT_POLICY)
        deadline = time.monotonic() + LOOKUP_TIMEOUT_S
        while (reply := ask(self.lineage, "lineage_request", {}, LINEAGE.connecter_receives,
                            self.rejects, ASK_S)) is None:
            if not self.keep_alive():
                raise WorkerStopped("stopped while asking the controller for the lineage")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the controller sent no lineage in {LOOKUP_TIMEOUT_S:.0f}s")
        lines, members = reply.arrays.get("events"), list(self.views)
        events = []
        for event in parse_lineage(lines.tobytes().decode()) if lines is not None else []:
            if problem := event_problem(event, members):  # counted and left out
                self.rejects.reject(ValueError(f"lineage event: {problem}"))
            else:
                events.append(event)
        return events

    def _changed(self, member: str, hyperparams: dict[str, float], version: int) -> None:
        view = self.views[member]
        view.hyperparams, view.changed_at = dict(hyperparams), version
        view.ready_at = version + self.config.population.ready_after_updates
        view.version, view.score = max(view.version, version), None

    def _take_rows(self) -> bool:
        """Take the metrics rows the controller sent since the last call; whether there
        were any."""
        taken = False
        while (received := receive(self.rows_in, ROWS.connecter_receives,
                                   self.rejects)) is not None:
            text = received[1].arrays.get("row")
            try:
                row = json.loads(text.tobytes()) if text is not None else None
            except ValueError:
                row = None
            if not isinstance(row, dict):
                self.rejects.reject(ValueError("metrics_row: not one JSON object"))
                continue
            self.rows.append(row)
            taken = True
        del self.rows[:-ROWS_KEPT]
        return taken

    def _update_views(self) -> None:
        window, metric = self.config.population.window, ranking_metric(self.config)
        for member, view in self.views.items():
            versions = [row[VERSION_KEY.format(member=member)] for row in self.rows
                        if VERSION_KEY.format(member=member) in row]
            if versions:
                view.version = max(view.version, int(versions[-1]))
            view.score = member_score(self.rows, member, view.changed_at, window, metric)
            view.ranked_version = ranked_version(self.rows, member, view.changed_at, metric)

    def run_once(self) -> None:
        changed = False
        ready = dict(self.poller.poll(POLL_MS))
        for socket in self.sockets.values():
            while socket in ready and (received := receive(
                    socket, CONTROL.connecter_receives, self.rejects)) is not None:
                self._answered(received[1].meta)
                changed = True
        now = time.monotonic()
        for member, (message, _, _) in self.pending.items():
            if now - self._resent[member] > REPLY_TIMEOUT_S:
                self.log.warning("no answer from %s's learner in %.0fs; sending its exploit "
                                 "again", member, REPLY_TIMEOUT_S)
                send(self.sockets[member], "exploit", message)
                self._resent[member] = now
        if not (self._take_rows() or changed):
            return  # nothing new to rank: the views and the decisions would be the same
        self._update_views()
        views = [v for v in self.views.values() if v.name not in self.pending]
        exploits, kept = decide(views, self.config.population, self.rng)
        for member in kept:
            view = self.views[member]
            view.ready_at = view.version + self.config.population.ready_after_updates
        for exploit in exploits:
            scores = {m: v.score for m, v in self.views.items()}
            self._exploit_ids += 1
            message = {"member": exploit.member, "donor": exploit.donor,
                       "donor_version": self.views[exploit.donor].ranked_version,
                       "hyperparams": exploit.hyperparams,
                       "old_hyperparams": self.views[exploit.member].hyperparams,
                       "scores": scores, "exploit_id": self._exploit_ids}
            send(self.sockets[exploit.member], "exploit", message)
            self.pending[exploit.member] = (message, time.monotonic(), time.time())
            self._resent[exploit.member] = time.monotonic()
            self.log.info("%s (score %.2f) copies %s (score %.2f): %s", exploit.member,
                          scores[exploit.member], exploit.donor, scores[exploit.donor],
                          exploit.hyperparams)

    def _answered(self, meta: dict[str, Any]) -> None:
        """A learner's answer. A copy counts even when it answers after the manager gave
        up on it: the learner has logged it and would restore it."""
        member, values, version = meta.get("member"), meta.get("hyperparams"), meta.get("version")
        if member not in self.views:
            self.rejects.reject(ValueError(f"answer from unknown member {member!r}"))
            return
        pending = self.pending.pop(member, None)
        self._resent.pop(member, None)
        if not meta.get("ok"):
            self.refused += 1
            donor = pending[0]["donor"] if pending else "its donor"
            self.log.info("%s did not copy %s: %s", member, donor, meta.get("reason"))
            return
        if not isinstance(values, dict) or not isinstance(version, int):
            self.rejects.reject(ValueError(f"answer from {member} without values or version"))
            return
        self.exploits += 1
        self._changed(member, values, version)

    def waiting(self) -> tuple[str, float] | None:
        if self.pending:
            member, (_, _, since) = next(iter(self.pending.items()))
            return f"{member}'s learner to copy its donor", since
        return super().waiting()

    def counters(self) -> dict[str, float]:
        return {"exploits": self.exploits, "exploits_refused": self.refused,
                "exploits_pending": len(self.pending)}

    def close(self) -> None:
        for socket in [*getattr(self, "sockets", {}).values(), getattr(self, "rows_in", None),
                       getattr(self, "lineage", None)]:
            if socket is not None:
                socket.close()
