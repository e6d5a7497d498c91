"""Both ends of a same-host stream: the connecter's `Outbox` (its slot file, the binder's
doorbell, its own reply doorbell) and the binder's `Inbox` (its doorbell, the peers'
slot files it maps on first sight). A malformed message is counted in the
receiver's `RejectCounter` and dropped, like one off a socket.

Requests and replies (the inference stream): the actor writes a request into one of its
split's two slots and rings; the server that claims it answers into the same slot of
the file's reply area and rings the actor's reply doorbell. A request sent again goes to
a slot no live server is answering, so a reply slot has one writer at a time. Chunks (the
samples and inserts streams): a ring of slots, each held until a binder has copied its
chunk out. Who may write a slot when is srl_jax/wire/shm/slot_file.py's; messages sit
in their slots in a fixed layout (srl_jax/wire/shm/layout.py).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from srl_jax.wire.codec import Message, WireError
from srl_jax.wire.shm.bell import MAX_SLOTS, READ_RECORDS, Bell, Ringer
from srl_jax.wire.shm.layout import SlotLayout
from srl_jax.wire.shm.place import Presence, alive, sweep_dead_peers
from srl_jax.wire.shm.slot_file import SlotFile, fence
from srl_jax.wire.streams import RejectCounter

SENT, REPLIES = 0, 1
"""The areas of a slot file: what the connecter writes, what the binder answers."""
FREE, WAITING, TAKEN = 0, 1, 2
"""A slot as its connecter sees it: free to write; its message waits in a doorbell
(unclaimed); a binder claimed it and has not finished with it."""


def _copied(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: array.copy() for name, array in arrays.items()}


def peer_path(stem: Path, token: int, suffix: str) -> Path:
    """A connecter's file of the stream and policy `stem` names: `<stem>.<token>.<suffix>`
    (its token: srl_jax/wire/shm/place.py)."""
    return stem.parent / f"{stem.name}.{token:08x}.{suffix}"


class Outbox:
    """A connecter's slots on one stream (its files named after `stem`), rung on the
    doorbells `bells`: in turn, the next one where one has no reader (a PUSH socket's
    spreading). A binder leaves records unread while it cannot take them (a replay
    server whose rate limiter holds inserts until the learner samples); at most
    slots / binders of the ring wait on one binder, so the rest still reaches the others
    (as a PUSH socket's high-water mark per pipe). Without that bound the whole ring
    could wait on one replay server while the learner waits on another for inserts.

    A slot is written again only once its binder is done with it, or the binder that
    claimed it died (`reclaimed` counts those: a chunk lost with its reader); a message
    that waits unread is never overwritten (`free_slot`), only a request withdrawn to be
    sent again (`open_slot`)."""

    def __init__(self, stem: Path, bells: list[Path], slots: int, layout: SlotLayout,
                 reply_layout: SlotLayout | None = None, reclaim_after_s: float = 60.0,
                 handoff_after_s: float = 60.0) -> None:
        """`reclaim_after_s`: a chunk unread this long is rung for again (its record may
        have been lost with a doorbell); `handoff_after_s`: no bell could be rung for this
        long, the stream is `unreachable` (its connecter hands it to ZeroMQ)."""
        if not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"{slots} slots: a doorbell record names at most {MAX_SLOTS}")
        directory = stem.parent
        sweep_dead_peers(directory)
        self.presence = Presence(directory)
        self.token = self.presence.token
        areas = [(slots, layout)] + ([(slots, reply_layout)] if reply_layout else [])
        file = None
        try:
            file = SlotFile.create(peer_path(stem, self.token, "slots"), areas)
            self.replies = Bell(peer_path(stem, self.token, "reply")) if reply_layout else None
        except BaseException:
            if file is not None:
                file.close(unlink=True)
            self.presence.leave()
            raise
        self.file = file
        self.ringers = [Ringer(bell) for bell in bells]
        self._turn = 0
        self.slots = slots
        self._per_binder = max(1, slots // len(bells))
        self._rung_to = [-1] * slots
        """The bell each slot was last rung on."""
        self._stamp_of = [0] * slots
        """The stamp of each slot's last message (0: none yet)."""
        self._sent_at = [0.0] * slots
        self.reclaim_after_s = reclaim_after_s
        self.handoff_after_s = handoff_after_s
        self._stamps = itertools.count(1)
        self._failing_since: float | None = None
        self.reclaimed = 0
        """Slots taken back from a binder that died holding them."""
        self.rerung = 0
        """Records rung again for messages left unread (a doorbell that lost them)."""

    @property
    def nbytes(self) -> int:
        return self.file.nbytes

    def fileno(self) -> int:
        """The reply doorbell (for a `zmq.Poller`)."""
        return self._reply_bell.fileno()

    @property
    def _reply_bell(self) -> Bell:
        if self.replies is None:
            raise ValueError("a stream without replies has no reply doorbell")
        return self.replies

    @property
    def unreachable(self) -> bool:
        """No bell of the stream could be rung for `handoff_after_s`."""
        return self._failing_since is not None and \
            time.monotonic() - self._failing_since > self.handoff_after_s

    def status(self, slot: int) -> int:
        """FREE, WAITING or TAKEN (by a binder alive or not: `open_slot` asks)."""
        stamp = self._stamp_of[slot]
        if stamp == 0 or self.file.done(SENT, slot) == stamp:
            return FREE
        if self.file.claim(SENT, slot)[0] == stamp:
            return TAKEN
        return WAITING if self.file.stamp(SENT, slot) == stamp else FREE

    def _reader_died(self, slot: int) -> bool:
        """Whether the binder that claimed `slot` is gone (then counted as reclaimed)."""
        if alive(self.file.path.parent, self.file.claim(SENT, slot)[1]):
            return False
        self.reclaimed += 1
        return True

    def free_slot(self) -> int | None:
        """A slot of the ring free to write (None: every one still holds a chunk): a free
        one, else one whose binder died holding it. Chunks unread for `reclaim_after_s`
        are rung for again, never overwritten."""
        self._ring_again()
        taken = []
        for slot in range(self.slots):
            status = self.status(slot)
            if status == FREE:
                return slot
            if status == TAKEN:
                taken.append(slot)
        return next((slot for slot in taken if self._reader_died(slot)), None)

    def open_slot(self, slots: range) -> int | None:
        """A slot of `slots` to write a request into: a free one, else one whose binder
        died, else one whose request still waits unclaimed, withdrawn (it is sent again);
        None while a live binder is answering each."""
        waiting = []
        for slot in slots:
            status = self.status(slot)
            if status == FREE or (status == TAKEN and self._reader_died(slot)):
                return slot
            if status == WAITING:
                waiting.append(slot)
        return next((slot for slot in waiting if self._withdraw(slot)), None)

    def _withdraw(self, slot: int) -> bool:
        """Take back an unclaimed message: stamp 0, then look for a claim (a binder that
        took it meanwhile either sees the 0 and lets it go, or is seen here): whether the
        slot is free to write now."""
        stamp = self._stamp_of[slot]
        self.file.set_stamp(SENT, slot, 0)
        fence()
        claim, reader = self.file.claim(SENT, slot)
        return not (claim == stamp and self.file.done(SENT, slot) != stamp
                    and alive(self.file.path.parent, reader))

    def send(self, slot: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bool:
        """Write a message into `slot` (one `free_slot` or `open_slot` gave) and ring;
        False if no binder reads its bell now, has room in it and in its share of the ring
        (the message is withdrawn: it is not sent)."""
        stamp = next(self._stamps)
        self.file.set_stamp(SENT, slot, 0)
        self._stamp_of[slot] = stamp
        self.file.views[SENT].write(slot, meta, arrays)
        self.file.set_stamp(SENT, slot, stamp)
        self._rung_to[slot] = -1
        for _ in self.ringers:
            turn = self._turn
            self._turn = (turn + 1) % len(self.ringers)
            if self._has_room(turn) and self._ring(turn, slot, stamp):
                self._sent_at[slot], self._rung_to[slot] = time.monotonic(), turn
                return True
        self.file.set_stamp(SENT, slot, 0)  # no record out: no binder can claim it
        return False

    def _ring(self, turn: int, slot: int, stamp: int) -> bool:
        ringer = self.ringers[turn]
        if ringer.ring(self.token, slot, stamp):
            self._failing_since = None
            return True
        if ringer.fd is None and self._failing_since is None:  # no reader, not a full bell
            self._failing_since = time.monotonic()
        return False

    def _ring_again(self) -> None:
        """Ring again for chunks unread for `reclaim_after_s`, and for those rung on a FIFO
        that its path no longer names, on the bell each was rung on."""
        now = time.monotonic()
        moved = {turn for turn, ringer in enumerate(self.ringers) if ringer.moved}
        for ringer in self.ringers:
            ringer.moved = False
        for slot in range(self.slots):
            turn = self._rung_to[slot]
            if turn >= 0 and (turn in moved or now - self._sent_at[slot] > self.reclaim_after_s) \
                    and self.status(slot) == WAITING \
                    and self.ringers[turn].ring(self.token, slot, self._stamp_of[slot]):
                self._sent_at[slot] = now
                self.rerung += 1

    def _has_room(self, turn: int) -> bool:
        """Whether fewer than its share of the slots wait on bell `turn` (one bell: the
        whole ring is its share)."""
        return len(self.ringers) == 1 or self._per_binder > sum(
            1 for slot in range(self.slots)
            if self._rung_to[slot] == turn and self.status(slot) == WAITING)

    def receive(self, rejects: RejectCounter) -> Message | None:
        """The next reply (arrays copied out of its slot), or None if none is waiting."""
        while (record := self._reply_bell.next()) is not None:
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
        self.presence.leave()


class _Peer:
    """A connecter's mapped file and, for replies, its doorbell."""

    def __init__(self, token: int, file: SlotFile, reply: Path) -> None:
        self.token = token
        self.file = file
        self.ringer = Ringer(reply)


class Route(NamedTuple):
    """Where a message came from, to answer it (`Inbox.reply`)."""

    peer: _Peer
    slot: int
    stamp: int


class Inbox:
    """A binder's side of one same-host stream: its doorbell and its peers' slots. Each
    message is taken once: claimed before it is read, done once copied out or answered;
    a record for a slot that no longer holds its message, or whose message was already
    claimed (a record replayed), is dropped and counted in `stale`."""

    def __init__(self, bell: Path, stem: Path, layouts: list[SlotLayout], max_slots: int,
                 rejects: RejectCounter, read_records: int = READ_RECORDS,
                 prune_every_s: float = 30.0) -> None:
        """`stem`: names the connecters' files (`Outbox`); `layouts`: what connecters
        send and, for a request stream, what it answers; `read_records`: records taken
        from the doorbell at once where `receive` is given no limit (1 where binders
        share the bell); `prune_every_s`: how often the files of peers that died are
        let go."""
        self.presence = Presence(stem.parent)
        self.token = self.presence.token
        try:
            self.bell = Bell(bell)
        except BaseException:
            self.presence.leave()
            raise
        self.stem = stem
        self.layouts = layouts
        self.max_slots = max_slots
        self.rejects = rejects
        self.read_records = read_records
        self.prune_every_s = prune_every_s
        self._pruned_at = time.monotonic()
        self.peers: dict[int, _Peer] = {}
        self._forgotten: list[_Peer] = []
        """Peers that exited, unmapped at the next prune."""
        self.received = 0
        self.stale = 0
        """Records whose slot no longer held their message (sent again, already taken,
        its connecter gone), and doorbell reads dropped as cut or not ours."""
        self.lost_replies = 0
        """Replies to a connecter that is gone."""

    def fileno(self) -> int:
        return self.bell.fileno()

    @property
    def pending(self) -> bool:
        return self.bell.pending

    @property
    def mapped_bytes(self) -> int:
        """Bytes of the peers' files this binder maps."""
        return sum(peer.file.nbytes for peer in self.peers.values())

    def counters(self) -> dict[str, float]:
        """Its heartbeat counters (srl_jax/dataflow/metrics_table.py, `shm_binder`)."""
        return {"shm_received": self.received, "shm_stale": self.stale + self.bell.torn,
                "shm_mapped_mib": self.mapped_bytes / 2**20}

    def _peer(self, token: int) -> _Peer | None:
        try:
            file = SlotFile.open(peer_path(self.stem, token, "slots"), self.layouts,
                                 self.max_slots)
        except FileNotFoundError:
            return None
        except (OSError, WireError) as error:
            self.rejects.reject(WireError(f"peer slot file: {error}"))
            return None
        peer = self.peers[token] = _Peer(token, file, peer_path(self.stem, token, "reply"))
        return peer

    def prune(self) -> None:
        """Unmap the files of peers forgotten at the last prune, and forget the peers that
        have exited since (a request of theirs may still wait in a batch being gathered:
        its reply finds the peer forgotten, not its file unmapped)."""
        self._pruned_at = time.monotonic()
        for peer in self._forgotten:
            self._let_go(peer)
        self._forgotten = []
        for token in [token for token in self.peers if not alive(self.stem.parent, token)]:
            self._forgotten.append(self.peers.pop(token))

    @staticmethod
    def _let_go(peer: _Peer) -> None:
        peer.ringer.close()
        peer.file.close()

    def _claim(self, file: SlotFile, slot: int, stamp: int) -> bool:
        """Take `slot`'s message of `stamp`, unless it is gone, taken or withdrawn (the
        slot's words read directly: this runs once a message, `SlotFile` says what they
        are)."""
        words, at = file.words, file.stamp_at[SENT][slot]
        if words[at] != stamp or words[at + 2] == stamp or words[at + 1] == stamp:
            return False
        file.set_claim(SENT, slot, stamp, self.token)
        fence()
        if words[at] != stamp:  # withdrawn meanwhile: let it go
            words[at + 2] = stamp
            return False
        return True

    def receive(self, copy: bool = False, limit: int | None = None
                ) -> tuple[Route, Message] | None:
        """The next well-formed message rung for, or None; at most `limit` records are
        read from the doorbell at once (`read_records` by default). `copy`: its arrays
        copied out and its slot given back at once (chunks); else they view the slot,
        which stays claimed until it is answered (`reply`) or let go (`release`)."""
        if time.monotonic() - self._pruned_at > self.prune_every_s:
            self.prune()
        kind = self.layouts[SENT].kind
        while (record := self.bell.next(limit or self.read_records)) is not None:
            token, slot, stamp = record
            peer = self.peers.get(token) or self._peer(token)
            if peer is None or not 0 <= slot < peer.file.counts[SENT] \
                    or not self._claim(peer.file, slot, stamp):
                self.stale += 1
                continue
            file = peer.file
            try:
                meta, arrays = file.views[SENT].read(slot)
                if copy:
                    arrays = _copied(arrays)
            except WireError as error:
                self.rejects.reject(error)
                file.set_done(SENT, slot, stamp)
                continue
            if copy:
                file.set_done(SENT, slot, stamp)
            self.received += 1
            return Route(peer, slot, stamp), Message(kind, meta, arrays)
        return None

    def release(self, route: Route) -> None:
        """Let a claimed request go unanswered (it was refused): its slot is free again."""
        if self.peers.get(route.peer.token) is route.peer:
            route.peer.file.set_done(SENT, route.slot, route.stamp)

    def reply(self, route: Route, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bool:
        """Answer into the slot's reply and ring its connecter; False if the request was
        withdrawn meanwhile (the answer is dropped) or the connecter is gone."""
        peer, slot, stamp = route
        file = peer.file
        if self.peers.get(peer.token) is not peer:  # forgotten: its connecter exited
            self.lost_replies += 1
            return False
        if file.stamp(SENT, slot) != stamp:
            file.set_done(SENT, slot, stamp)
            self.stale += 1
            return False
        file.set_stamp(REPLIES, slot, 0)
        file.views[REPLIES].write(slot, meta, arrays)
        file.set_stamp(REPLIES, slot, stamp)
        file.set_done(SENT, slot, stamp)
        if peer.ringer.ring(self.token, slot, stamp):
            return True
        self.lost_replies += 1
        if not alive(self.stem.parent, peer.token):
            self._forgotten.append(self.peers.pop(peer.token))
        return False

    def close(self) -> None:
        for peer in (*self.peers.values(), *self._forgotten):
            self._let_go(peer)
        self.peers, self._forgotten = {}, []
        self.bell.close()
        self.presence.leave()
