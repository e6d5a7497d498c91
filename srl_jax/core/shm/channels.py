"""Both ends of a same-host stream: the connecter's `Outbox` (its slot file, the binder's
doorbell, its own reply doorbell) and the binder's `Inbox` (its doorbell, the peers'
slot files it maps on first sight). A malformed message is counted in the
receiver's `RejectCounter` and dropped, like one off a socket.

Requests and replies (the inference stream): the actor writes a request into its slot
(two per split, alternating, so that a request sent again never overwrites one a
server may be reading) and rings; a server answers into the same slot of the file's
reply area and rings the actor's reply doorbell. Chunks (the samples and inserts
streams): a ring of slots, each FULL until a binder has copied its chunk out.
Messages sit in their slots in a fixed layout (srl_jax/core/shm/layout.py).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from srl_jax.core.shm.bell import Bell, Ringer
from srl_jax.core.shm.layout import SlotLayout
from srl_jax.core.shm.place import alive, sweep_dead_peers
from srl_jax.core.shm.slot_file import FREE, FULL, TAKEN, SlotFile
from srl_jax.core.streams import RejectCounter
from srl_jax.core.wire import Message, WireError

SENT, REPLIES = 0, 1
"""The areas of a slot file: what the connecter writes, what the binder answers."""
MAX_PEERS_BEFORE_PRUNE = 64


def _copied(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: array.copy() for name, array in arrays.items()}


def peer_path(stem: Path, pid: int, suffix: str) -> Path:
    """A connecter's file of the stream and policy `stem` names: `<stem>.<pid>.<suffix>`."""
    return stem.parent / f"{stem.name}.{pid}.{suffix}"


class Outbox:
    """A connecter's slots on one stream (its files named after `stem`), rung on the
    doorbells `bells`: in turn, the next one where one has no reader (a PUSH socket's
    spreading). A binder leaves records unread while it cannot take them (a replay
    server whose rate limiter holds inserts until the learner samples); at most
    slots / binders of the ring wait on one binder, so the rest still reaches the others
    (as a PUSH socket's high-water mark per pipe). Without that bound the whole ring
    could wait on one replay server while the learner waits on another for inserts."""

    def __init__(self, stem: Path, bells: list[Path], slots: int, layout: SlotLayout,
                 reply_layout: SlotLayout | None = None, reclaim_after_s: float = 60.0) -> None:
        sweep_dead_peers(stem.parent)
        self.pid = os.getpid()
        areas = [(slots, layout)] + ([(slots, reply_layout)] if reply_layout else [])
        self.file = SlotFile.create(peer_path(stem, self.pid, "slots"), areas)
        self.replies = Bell(peer_path(stem, self.pid, "reply")) if reply_layout else None
        self.ringers = [Ringer(bell) for bell in bells]
        self._turn = 0
        self.slots = slots
        self._per_binder = max(1, slots // len(bells))
        self._rung_to = [-1] * slots
        """The bell each slot was last rung on."""
        self.reclaim_after_s = reclaim_after_s
        self._stamps = itertools.count(1)
        self._sent_at = [0.0] * slots

    @property
    def nbytes(self) -> int:
        return self.file.nbytes

    def fileno(self) -> int:
        """The reply doorbell (for a `zmq.Poller`)."""
        return self.replies.fileno()

    def send(self, slot: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bool:
        """Write a message into `slot` and ring; False if no binder reads its bell now,
        has room in it and in its share of the ring (the slot is withdrawn: the message
        is not sent)."""
        stamp = next(self._stamps)
        self.file.set_stamp(SENT, slot, 0)
        self.file.views[SENT].write(slot, meta, arrays)
        self.file.set_state(SENT, slot, FULL)
        self.file.set_stamp(SENT, slot, stamp)
        self._rung_to[slot] = -1
        for _ in self.ringers:
            turn = self._turn
            self._turn = (turn + 1) % len(self.ringers)
            if self._has_room(turn) and self.ringers[turn].ring(self.pid, slot, stamp):
                self._sent_at[slot], self._rung_to[slot] = time.monotonic(), turn
                return True
        self.file.set_stamp(SENT, slot, 0)
        self.file.set_state(SENT, slot, FREE)
        return False

    def _has_room(self, turn: int) -> bool:
        """Whether fewer than its share of the slots wait on bell `turn` (one bell: the
        whole ring is its share)."""
        return len(self.ringers) == 1 or self._per_binder > sum(
            1 for slot in range(self.slots)
            if self._rung_to[slot] == turn and self.file.state(SENT, slot)[0] == FULL)

    def free_slot(self) -> int | None:
        """A slot of the ring free to write (None: every one still holds a chunk): free
        ones, and those of a reader that died holding them or left unread for
        `reclaim_after_s` (their doorbell records, if still queued, then read as stale)."""
        now = time.monotonic()
        for slot in range(self.slots):
            state, reader = self.file.state(SENT, slot)
            if state == FREE or (state == TAKEN and not alive(reader)) or (
                    state == FULL and now - self._sent_at[slot] > self.reclaim_after_s):
                return slot
        return None

    def receive(self, rejects: RejectCounter) -> Message | None:
        """The next reply (arrays copied out of its slot), or None if none is waiting."""
        while (record := self.replies.next()) is not None:
            _, slot, stamp = record
            if not 0 <= slot < self.slots or self.file.stamp(REPLIES, slot) != stamp:
                continue
            try:
                meta, arrays = self.file.views[REPLIES].read(slot)
            except WireError as error:
                rejects.reject(error)
                continue
            arrays = _copied(arrays)
            if self.file.stamp(REPLIES, slot) == stamp:
                return Message(self.file.views[REPLIES].layout.kind, meta, arrays)
        return None

    def close(self) -> None:
        for ringer in self.ringers:
            ringer.close()
        if self.replies is not None:
            self.replies.close()
            self.replies.path.unlink(missing_ok=True)
        self.file.close(unlink=True)


class InTurn:
    """Takes messages from one of its sources (a binder's shared memory and its socket)
    until it has none, then from the next; `rotate`, once a batch, moves on to the next
    source, so that a busy one never starves the other."""

    def __init__(self, *sources: Callable[[], Any]) -> None:
        self.sources = sources
        self._at = 0

    def __call__(self) -> Any:
        for _ in self.sources:
            if (received := self.sources[self._at]()) is not None:
                return received
            self._at = (self._at + 1) % len(self.sources)
        return None

    def rotate(self) -> None:
        self._at = (self._at + 1) % len(self.sources)


class _Peer:
    """A connecter's mapped file and, for replies, its doorbell."""

    def __init__(self, pid: int, file: SlotFile, reply: Path) -> None:
        self.pid = pid
        self.file = file
        self.ringer = Ringer(reply)


class Route(NamedTuple):
    """Where a message came from, to answer it (`Inbox.reply`)."""

    peer: _Peer
    slot: int
    stamp: int


class Inbox:
    """A binder's side of one same-host stream: its doorbell and its peers' slots."""

    def __init__(self, bell: Path, stem: Path, layouts: list[SlotLayout], max_slots: int,
                 rejects: RejectCounter) -> None:
        """`stem`: names the connecters' files (`Outbox`); `layouts`: what connecters
        send and, for a request stream, what it answers."""
        self.bell = Bell(bell)
        self.stem = stem
        self.layouts = layouts
        self.max_slots = max_slots
        self.rejects = rejects
        self.pid = os.getpid()
        self.peers: dict[int, _Peer] = {}
        self.received = 0
        self.stale = 0
        """Records whose slot no longer held their message (sent again, or given up)."""
        self.lost_replies = 0
        """Replies to a connecter that is gone."""

    def fileno(self) -> int:
        return self.bell.fileno()

    @property
    def pending(self) -> bool:
        return self.bell.pending

    def _peer(self, pid: int) -> _Peer | None:
        peer = self.peers.get(pid)
        if peer is None:
            try:
                file = SlotFile.open(peer_path(self.stem, pid, "slots"), self.layouts,
                                     self.max_slots)
            except FileNotFoundError:
                return None
            except (OSError, WireError) as error:
                self.rejects.reject(WireError(f"peer slot file: {error}"))
                return None
            if len(self.peers) >= MAX_PEERS_BEFORE_PRUNE:
                self.prune()
            peer = self.peers[pid] = _Peer(pid, file, peer_path(self.stem, pid, "reply"))
        return peer

    def prune(self) -> None:
        """Unmap the files of peers that have exited."""
        for pid in [pid for pid in self.peers if not alive(pid)]:
            self._forget(pid)

    def _forget(self, pid: int) -> None:
        peer = self.peers.pop(pid)
        peer.ringer.close()
        peer.file.close()

    def receive(self, copy: bool = False) -> tuple[Route, Message] | None:
        """The next well-formed message rung for, or None. `copy`: its arrays copied out
        and its slot given back at once (chunks); else they view the slot, which stays
        the connecter's until it is answered (requests: `reply` checks it still holds
        the request)."""
        kind = self.layouts[SENT].kind
        while (record := self.bell.next()) is not None:
            pid, slot, stamp = record
            peer = self.peers.get(pid) or self._peer(pid)
            if peer is None or not 0 <= slot < peer.file.counts[SENT] \
                    or peer.file.stamp(SENT, slot) != stamp:
                self.stale += 1
                continue
            file = peer.file
            if copy:  # a writer takes back a TAKEN slot only once this process is gone
                file.set_state(SENT, slot, TAKEN, self.pid)
            try:
                meta, arrays = file.views[SENT].read(slot)
                if copy:
                    arrays = _copied(arrays)
            except WireError as error:
                self.rejects.reject(error)
                meta = None
            if copy:
                if file.stamp(SENT, slot) != stamp:  # taken back meanwhile: not ours
                    self.stale += meta is not None
                    continue
                file.set_state(SENT, slot, FREE)
            if meta is not None:
                self.received += 1
                return Route(peer, slot, stamp), Message(kind, meta, arrays)
        return None

    def reply(self, route: Route, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bool:
        """Answer into the slot's reply and ring its connecter; False if the request was
        sent again meanwhile (the answer is dropped) or the connecter is gone."""
        peer, slot, stamp = route
        file = peer.file
        if file.stamp(SENT, slot) != stamp:
            self.stale += 1
            return False
        file.set_stamp(REPLIES, slot, 0)
        file.views[REPLIES].write(slot, meta, arrays)
        file.set_stamp(REPLIES, slot, stamp)
        if peer.ringer.ring(self.pid, slot, stamp):
            return True
        self.lost_replies += 1
        if not alive(peer.pid) and self.peers.get(peer.pid) is peer:
            self._forget(peer.pid)
        return False

    def close(self) -> None:
        for pid in list(self.peers):
            self._forget(pid)
        self.bell.close()
