"""A worker's ends of the same-host streams: when to use shared memory, and opening it.

`transport.shared_memory`: `auto` uses it wherever binder and connecter were started by
one owner (srl_jax/wire/shm/place.py: the controller of a local run), which is what
sharing a host means here; `off` never; `on` as auto, and anything that keeps a worker
from it (no owner, a host without /dev/shm or not x86, a directory that is not private)
is then an error instead of a fallback. A binder registers its doorbell under
`Stream.bell_key` before it binds its ZMQ socket, so a connecter that found every
binder's socket finds their doorbells too; it writes to them only if every binder of the
stream shares its owner (else ZeroMQ carries all of it: the binders elsewhere would never
see a chunk rung here). Workers whose launch backend names no owner (Ray's, a cluster's,
or started by hand) use ZeroMQ. A worker shell opens neither end itself: `Worker.connect`
and `Worker.bind` (srl_jax/runtime/worker_base.py) give it one object per end, its socket
and, where this module opens them, its slots or doorbell (srl_jax/wire/stream_ends.py).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from srl_jax.config.schema import ConfigError, ExperimentConfig
from srl_jax.dataflow.stream_table import INFERENCE, Stream
from srl_jax.dataflow.worker_kinds import worker_kind
from srl_jax.wire.shm import place
from srl_jax.wire.shm.bell import READ_RECORDS
from srl_jax.wire.shm.channels import Inbox, Outbox
from srl_jax.wire.shm.layout import REQUEST_SLOTS, SlotLayout

log = logging.getLogger(__name__)
SCHEME = "shm://"


class SharedMemoryUnavailable(ConfigError):
    """`transport.shared_memory: on` on a host without it: the worker refuses (its exit
    ends the run with this line, srl_jax/worker.py) rather than failing and restarting."""


def owner_directory(mode: str) -> Path | None:
    """This worker's owner's directory, or None where shared memory is not used (with
    `on`, SharedMemoryUnavailable says why instead)."""
    if mode == "off":
        return None
    owner = os.environ.get(place.OWNER_ENV)
    problem = place.unsupported_reason() or (
        None if owner else "this worker has no owner of shared memory (only the local "
        "backend's workers share a host through it)")
    if problem is None and owner:
        try:
            place.check_private(Path(owner), stat.S_IFDIR)
            return Path(owner)
        except OSError as error:
            problem = f"the shared-memory directory is refused: {error}"
    if mode == "on":
        raise SharedMemoryUnavailable(f"'transport.shared_memory: on': {problem}; set it "
                                      "to auto or off")
    if owner:
        log.warning("no shared memory: %s; ZeroMQ carries the same-host streams", problem)
    return None


def stream_slots(config: ExperimentConfig, stream: Stream) -> tuple[int, int]:
    """The slots of a connecter's file on `stream`, and how many of them each actor split
    has (0: a ring any chunk may take): a request stream's REQUEST_SLOTS per split, a
    chunk stream's `actors.send_queue` (a PUSH socket's high-water mark)."""
    if stream.connecter_receives:
        return REQUEST_SLOTS * config.actors.splits, REQUEST_SLOTS
    return config.actors.send_queue, 0


def stream_stem(directory: Path, stream: Stream, policy: str) -> Path:
    """What the files of `policy`'s `stream` are named after."""
    return directory / f"{stream.name}.{policy.encode().hex()}"


def bell_path(stem: Path, stream: Stream, index: int) -> Path:
    """Binder `index`'s doorbell; the inference servers of a policy share one, which
    spreads requests to whichever is free (samples and inserts go round the binders)."""
    return Path(f"{stem}.bell" if stream is INFERENCE else f"{stem}.{index}.bell")


def _stem(worker: Any, stream: Stream, policy: str) -> Path | None:
    """Where `policy`'s files of `stream` live under the worker's owner directory; None
    where shared memory is not used."""
    directory = owner_directory(worker.config.transport.shared_memory)
    return None if directory is None else stream_stem(directory, stream, policy)


def open_inbox(worker: Any, stream: Stream, layouts: list[SlotLayout], max_slots: int,
               policy: str | None = None) -> Inbox | None:
    """The binder's end of `stream`, its doorbell registered under the stream's bell key
    (call before binding the ZMQ socket); None where shared memory is not used."""
    policy = worker.policy if policy is None else policy
    mode, stem = worker.config.transport.shared_memory, _stem(worker, stream, policy)
    if stem is None:
        return None
    bell = bell_path(stem, stream, worker.index)
    try:
        inbox = Inbox(bell, stem, layouts, max_slots, worker.rejects,
                      read_records=1 if stream is INFERENCE else READ_RECORDS,
                      prune_every_s=worker.config.runtime.heartbeat_timeout_s / 2)
    except OSError as error:
        _unavailable(mode, stream, error)
        return None
    worker.names.register(stream.bell_key(policy, worker.index), SCHEME + str(bell))
    return inbox


def open_outbox(worker: Any, stream: Stream, slots: int, layout: SlotLayout,
                reply_layout: SlotLayout | None = None, policy: str | None = None
                ) -> Outbox | None:
    """The connecter's end of `stream` (call once its ZMQ socket found every binder), or
    None: shared memory is not used, or some binder does not share this worker's owner."""
    policy = worker.policy if policy is None else policy
    mode, stem = worker.config.transport.shared_memory, _stem(worker, stream, policy)
    if stem is None:
        return None
    binders = range(worker_kind(stream.binder).count(worker.config))
    bells = sorted({bell_path(stem, stream, index) for index in binders})
    registered = {worker.names.get(stream.bell_key(policy, index)) for index in binders}
    if registered != {SCHEME + str(bell) for bell in bells}:
        return None
    timeout = worker.config.runtime.heartbeat_timeout_s
    try:
        return Outbox(stem, bells, slots, layout, reply_layout, reclaim_after_s=timeout,
                      handoff_after_s=timeout)
    except OSError as error:
        _unavailable(mode, stream, error)
        return None


def _unavailable(mode: str, stream: Stream, error: OSError) -> None:
    """A stream's shared memory could not be opened: ZeroMQ carries it (`on`: an error)."""
    if mode == "on":
        raise SharedMemoryUnavailable(f"shared memory for the {stream.name} stream: "
                                      f"{error}") from None
    log.warning("no shared memory for the %s stream (%s): ZeroMQ carries it", stream.name,
                error)
