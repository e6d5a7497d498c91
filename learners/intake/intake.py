"""The learner's intake: where its training batches come from, as one small interface.

A learner trains on what its algorithm's declared source names (`chunk_stream`, the
same choice the actors make): chunks the actors push on the sample stream (`SampleIntake`,
learners/intake/sample_intake.py), or transitions sampled by the policy's replay servers
(`ReplayIntake`, learners/intake/replay_intake.py), which take each row's new priority
back. The learner worker knows only `Intake`; `open_intake` picks the one and opens its
sockets.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from actors.actor_core import MAX_SENT_RETURNS
from learners.intake.replay_intake import ReplayIntake
from learners.intake.sample_intake import SampleIntake
from learners.training.sample_queue import SampleQueue
from srl_jax.dataflow.algorithms import (
    algorithm,
    chunk_overlap,
    chunk_stream,
    replay_of,
    sampled_fields,
    sampled_window,
)
from srl_jax.dataflow.chunk_spec import run_chunk_layout
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.shm_layouts import chunk_slot_layout
from srl_jax.dataflow.stream_table import REPLAY, SAMPLES
from srl_jax.runtime.worker_base import Worker


class Intake(Protocol):
    """Receives, checks and counts what a learner process trains on; hands it out in
    batches of host arrays."""

    kept: tuple[str, ...]
    """Host arrays of a batch that the learner keeps past putting it on the mesh, and
    hands back to `trained` (`versions`, the versions that acted, also give the policy lag)."""
    recent_returns: deque[float]
    """Training episode returns, newest last: they rank checkpoints (`checkpoint.keep_best`)."""

    @property
    def queued(self) -> int:
        """Received and not trained on yet (chunks, or parts of batches)."""

    def pump(self, timeout_ms: int, version: int) -> None:
        """Receive what is waiting, waiting up to `timeout_ms` for something; `version`:
        the learner's, as it receives."""

    def take_batch(self, version: int) -> dict[str, np.ndarray] | None:
        """The next batch for the learner at `version`, or None while too little is here."""

    def forget_before(self, version: int) -> None:
        """Drop what parameters older than `version` acted, queued or yet to come (a
        population member that copied its donor); off-policy samples stay."""

    def trained(self, kept: dict[str, np.ndarray], per_row: np.ndarray | None) -> None:
        """After the update on a batch: its `kept` arrays and the update's per-row
        results over the global batch (new priorities), where the algorithm has them."""

    def waiting_on(self) -> str:
        """What the learner waits for while no batch is ready (heartbeats say it)."""

    def counters(self) -> dict[str, float]:
        """Its counters: those in `srl_jax.dataflow.metrics_table.CARRIED` belong to the run
        and are checkpointed; the rest are its own."""

    def restore(self, counters: dict[str, float], recent_returns: list[float]) -> None:
        """Continue the counters (and the returns window) a checkpoint carried."""

    def close(self) -> None:
        """Close its sockets."""


def open_intake(worker: Worker, spec: EnvSpec, local_envs: int, process_index: int) -> Intake:
    """The intake of `worker`'s algorithm for `local_envs` env columns (or sampled rows)
    of each batch, its sockets bound or connected through `worker`."""
    config = worker.config
    cfg = config.learner
    if chunk_stream(config) is SAMPLES:
        layout = run_chunk_layout(config, spec)
        samples = worker.bind(SAMPLES, [chunk_slot_layout(layout, MAX_SENT_RETURNS)],
                              hwm=cfg.sample_queue)
        return SampleIntake(samples, SAMPLES.key(worker.policy, worker.index), layout,
                            SampleQueue(cfg.sample_queue, local_envs, cfg.staleness_cap,
                                        chunk_overlap(config)),
                            worker.rejects)
    servers = config.replay.count
    sockets = [worker.socket(REPLAY, index=i) for i in range(servers)]
    keys = [REPLAY.key(worker.policy, i) for i in range(servers)]
    algo, replay = algorithm(cfg.algorithm), replay_of(config)
    fields = sampled_fields(algo)
    window = sampled_window(config)
    # A whole chunk column trains its steps after the burn-in; a transition or a position
    # one step.
    steps_per_row = window - cfg.burn_in if replay.sequences and not replay.positions else 1
    return ReplayIntake(sockets, keys, local_envs, window, spec,
                        config.replay.importance_exponent, worker.rejects, process_index,
                        worker.incarnation.seed(config.seed * 7919 + process_index),
                        fields, steps_per_row, config.replay.batches_per_request,
                        spec.agents if replay.teams else 1)
