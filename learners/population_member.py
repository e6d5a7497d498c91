"""A learner as a member of a population (PBT): its starting hyperparameters, and its
side of the exploit protocol with the population manager
(srl_jax/runtime/population_manager.py).

On the control stream the manager tells a losing member to copy a winner (the donor)
and take new hyperparameters; the member answers what it loaded. The copy comes from
the donor's newest complete checkpoint, so it needs no word with the donor's learner,
and a member records each copy in the run's lineage: it sends it to the controller on
the lineage stream, which appends it to `population.jsonl` in the run directory on its
own host (srl_jax/runtime/population_link.py), so the learner's host needs no run directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from learners.training.checkpoint import Checkpointer
from learners.training.learner import Learner
from srl_jax.config.population import field_name, finite_numbers, initial_hyperparams
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig, member_names
from srl_jax.dataflow.stream_table import CONTROL, LINEAGE
from srl_jax.runtime.worker_base import Worker
from srl_jax.wire.streams import RejectCounter, ask, receive, send

RECORD_TIMEOUT_S = 10.0
"""How long a copy waits for the controller to say it recorded it in the lineage."""


def start_hyperparams(config: ExperimentConfig, policy: str, learner: Learner) -> None:
    """A population member starts from its own values (a checkpoint's win over them)."""
    if config.population.members:
        start = initial_hyperparams(config)[policy]
        learner.set_hyperparams({field_name(k): v for k, v in start.items()})


class PopulationMember:
    """Answers the population manager's exploits: copies the donor, reports, records."""

    def __init__(self, socket: zmq.Socket, lineage: zmq.Socket, member: str,
                 members: list[str], learner: Learner, checkpointer: Checkpointer,
                 rejects: RejectCounter, log: logging.Logger,
                 save_copy: Callable[[], None]) -> None:
        """`socket`: bound on the control stream; `lineage`: connected to the controller's
        lineage stream; `save_copy` drops what the old parameters acted, publishes the
        learner's parameters and starts checkpointing its state with the run's counters."""
        self.socket = socket
        self.lineage = lineage
        self.member = member
        self.members = members
        self.learner = learner
        self.checkpointer = checkpointer
        self.rejects = rejects
        self.log = log
        self.save_copy = save_copy
        self._last: tuple[int, dict[str, Any]] | None = None
        """The last exploit done, by its id, and the answer it got: one sent again (the
        manager heard nothing in time) is answered again, not done twice."""

    def answer(self) -> None:
        """Answer the exploits that are waiting (see `exploit`)."""
        while (received := receive(self.socket, CONTROL.binder_receives, self.rejects,
                                   envelope=1)) is not None:
            routing, message = received
            exploit_id = message.meta.get("exploit_id")
            if self._last is not None and exploit_id == self._last[0]:
                reply = self._last[1]
            else:
                reply = {"member": self.member, **self.exploit(message.meta)}
                if type(exploit_id) is int:
                    self._last = (exploit_id, reply)
            send(self.socket, "exploited", reply, routing=routing)

    def exploit(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Copy the donor member's parameters that earned its rank (weights, optimizer
        state, observation statistics: its newest complete checkpoint of the ranked
        version `donor_version` or before, `checkpoint.every_updates` apart at most) into
        this learner, keeping its own version count and counters, take the new
        hyperparameters, and forget the chunks its old parameters acted (`save_copy`); no
        restart, no recompile.

        The copy is checkpointed, and only once that checkpoint is complete does this
        learner send the event to the controller (which appends it to `population.jsonl`)
        and then answer: the lineage then never lists a copy that a restart or a resume
        would not bring back, nor misses one it would, even when the run stops before the
        manager hears the answer.
        """
        donor, values, old = meta.get("donor"), meta.get("hyperparams"), meta.get("old_hyperparams")
        scores, ranked = meta.get("scores"), meta.get("donor_version")
        if donor not in self.members or donor == self.member or \
                not (type(ranked) is int and ranked >= 0) or \
                not (finite_numbers(values) and finite_numbers(old) and
                     finite_numbers(scores, missing=True)) or \
                not {field_name(str(k)) for k in values} <= set(self.learner.hyperparams()):
            self.rejects.reject(ValueError(f"exploit with donor {donor!r}, values {values!r}"))
            return {"ok": False, "reason": "malformed exploit"}
        try:
            restored = self.checkpointer.restore_from(donor, self.learner.state, ranked)
            if restored is None:
                return {"ok": False, "reason": f"{donor} has no complete checkpoint of "
                                               f"version {ranked} or before yet"}
        except (OSError, ValueError) as error:
            return {"ok": False, "reason": f"cannot copy {donor}: {error}"}
        self.learner.adopt(restored.state)
        self.learner.set_hyperparams({field_name(k): float(v) for k, v in values.items()})
        version = self.learner.version
        self.log.info("copied %s's step %d as version %d; hyperparameters %s", donor,
                      restored.step, version, self.learner.hyperparams())
        self.save_copy()
        self.checkpointer.wait()
        self._record({"time": time.time(), "member": self.member, "donor": donor,
                      "donor_step": restored.step, "version": version,
                      "old_hyperparams": old, "hyperparams": values, "scores": scores})
        return {"ok": True, "donor_step": restored.step, "version": version,
                "hyperparams": values}

    def _record(self, event: dict[str, Any]) -> None:
        """The copy into the controller's lineage; one it did not record is logged (the
        copy stands: this learner's checkpoints hold it)."""
        reply = ask(self.lineage, "lineage_event", {"event": event}, LINEAGE.connecter_receives,
                    self.rejects, RECORD_TIMEOUT_S)
        if reply is None or "error" in reply.meta:
            self.log.warning("the controller may not have recorded the copy of %s in the "
                             "lineage: %s", event["donor"], reply.meta["error"] if reply else
                             f"no answer in {RECORD_TIMEOUT_S:.0f}s")

    def close(self) -> None:
        self.socket.close()
        self.lineage.close()


def open_population_member(worker: Worker, learner: Learner, checkpointer: Checkpointer | None,
                           save_copy: Callable[[], None]) -> PopulationMember | None:
    """`worker`'s part in its population's exploits, its control socket bound; None where
    the run has no population that exploits (one that does has checkpoints: config checks)."""
    population = worker.config.population
    if not (population.members and population.exploit):
        return None
    if checkpointer is None:
        raise ValueError("a population that exploits copies checkpoints: it needs them on")
    return PopulationMember(worker.socket(CONTROL), worker.socket(LINEAGE, DEFAULT_POLICY),
                            worker.policy, member_names(population.members), learner,
                            checkpointer, worker.rejects, worker.log, save_copy)
