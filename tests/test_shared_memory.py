"""Same-host streams through shared memory (srl_jax/wire/shm/): both ends of the
inference and chunk streams over real files in /dev/shm and real FIFOs, the wire's rules
on a slot (bounded rows, a peer of another layout refused, counted and dropped), and
what the kernel vouches for: peers and owners alive by their locks (not their pids), a
slot never overwritten while its message waits or is read, each message taken once,
directories and FIFOs that are this user's alone; a stream's ends over both transports
(srl_jax/wire/stream_ends.py). Runs that kill workers and controllers
with shared memory on: tests/test_faults.py and tests/test_run.py; runs in two PID
namespaces and under a small /dev/shm: tests/test_shm_isolation.py."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError, ExperimentConfig, request_rows
from srl_jax.dataflow import shm_budget as budget
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.shm_layouts import chunk_slot_layout, reply_layout, request_layout
from srl_jax.dataflow.stream_table import INFERENCE, SAMPLES
from srl_jax.runtime.shm_attach import (
    SCHEME,
    SharedMemoryUnavailable,
    open_inbox,
    open_outbox,
    owner_directory,
)
from srl_jax.wire.names import FileNameService
from srl_jax.wire.shm import bell as bell_module
from srl_jax.wire.shm import place
from srl_jax.wire.shm.bell import MAGIC, RECORD, Bell
from srl_jax.wire.shm.channels import FREE, TAKEN, WAITING, Inbox, Outbox, Route, peer_path
from srl_jax.wire.shm.layout import PREFIX_BYTES
from srl_jax.wire.stream_ends import Binder, Connecter
from srl_jax.wire.streams import RejectCounter
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(place.unsupported_reason() is not None,
                                reason="needs /dev/shm on x86")

SPEC = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_dim=2, continuous=False)
CONFIG = ExperimentConfig()
CONFIG.selfplay.opponents = {"default": "trained"}  # a policy with every field: opponents
REQUEST, REPLY = request_layout(CONFIG, SPEC, "default"), reply_layout(CONFIG, SPEC, "default")
CHUNK = chunk_slot_layout({"obs": ((9, 4, 4), np.dtype(np.float32)),
                           "rewards": ((8, 4), np.dtype(np.float32))}, max_returns=16)
OBS = np.zeros((2, 4), np.float32)
ANSWER = {"action": np.zeros(2, np.int32)}
CHUNK_ARRAYS = {"obs": np.ones((9, 4, 4), np.float32), "rewards": np.ones((8, 4), np.float32)}


def answer(seq: int, rows: int = 2) -> dict:
    return {"split": 0, "seq": seq, "version": 0, "batch_rows": rows}


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    """A directory in /dev/shm of the test's own, removed with what is left in it."""
    directory = place.SHM_ROOT / f"srl_jax-test-{os.getpid()}-{tmp_path.name}"
    directory.mkdir(mode=0o700)
    yield directory
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()


def ends(shm_dir: Path, rejects: RejectCounter, slots: int = 4, read_records: int = 1
         ) -> tuple[Inbox, Outbox]:
    stem = shm_dir / "inference.test"
    bell = Path(f"{stem}.bell")
    return Inbox(bell, stem, [REQUEST, REPLY], slots, rejects, read_records), \
        Outbox(stem, [bell], slots, REQUEST, REPLY)


def chunk_ends(shm_dir: Path, binders: int = 1, slots: int = 2, **outbox: float
               ) -> tuple[list[Inbox], Outbox]:
    stem = shm_dir / "samples.test"
    bells = [Path(f"{stem}.{i}.bell") for i in range(binders)]
    return [Inbox(bell, stem, [CHUNK], slots, RejectCounter()) for bell in bells], \
        Outbox(stem, bells, slots, CHUNK, **outbox)


def replay(bell: Path, token: int, slot: int, stamp: int) -> None:
    """Ring `bell` again with a record already rung (a writer that replays records)."""
    with open(bell, "wb", buffering=0) as fifo:
        fifo.write(RECORD.pack(token, slot, MAGIC, stamp))


def test_a_request_and_its_reply_go_through_the_slots(shm_dir: Path) -> None:
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert outbox.send(1, {"split": 0, "seq": 1}, {"obs": obs})
    route, request = inbox.receive()
    assert request.kind == "infer_request" and request.meta == {"split": 0, "seq": 1}
    assert set(request.arrays) == {"obs"}  # the opponents were left out
    plain = request_layout(ExperimentConfig(), SPEC, "default")  # no state, mask, opponent
    assert [field.name for field in plain.fields] == ["obs"]
    np.testing.assert_array_equal(request.arrays["obs"], obs)
    assert outbox.status(1) == TAKEN, "claimed by the server until it answers"
    reply = {"action": np.array([1, 0, 1], np.int32), "logp": np.zeros(3, np.float32),
             "value": np.ones(3, np.float32)}
    assert inbox.reply(route, {**answer(1, 3), "pool": [2, 5]}, reply)
    assert outbox.status(1) == FREE
    got = outbox.receive(rejects)
    assert got.meta == {**answer(1, 3), "pool": [2, 5]}
    np.testing.assert_array_equal(got.arrays["action"], reply["action"])
    assert outbox.receive(rejects) is None and inbox.receive() is None
    assert rejects.count == 0 and inbox.stale == 0
    outbox.close()
    inbox.close()


def test_request_slots_hold_the_most_rows_one_request_carries(shm_dir: Path) -> None:
    """Not the servers' max_batch: atari_pong_impala's were 110 MiB an actor."""
    rows = request_rows(CONFIG.actors, SPEC.agents)
    assert REQUEST.fields[0].max_rows == rows < CONFIG.inference.max_batch * 4
    inbox, outbox = ends(shm_dir, RejectCounter())
    with pytest.raises(ValueError, match="do not fit"):
        outbox.send(0, {"split": 0, "seq": 1}, {"obs": np.zeros((3, 5), np.float32)})
    with pytest.raises(ValueError, match="do not fit"):
        outbox.send(0, {"split": 0, "seq": 1}, {"obs": np.zeros((rows + 1, 4), np.float32)})
    outbox.close()
    inbox.close()


def test_a_slot_with_rows_past_its_bound_is_counted_and_dropped(shm_dir: Path) -> None:
    """The row count is what a slot's reader takes from shared memory: out of bounds,
    the message is malformed (counted once, as a socket's would be) and the next one
    is read; its slot is free again."""
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    outbox.send(0, {"split": 0, "seq": 1}, {"obs": OBS})
    rows = memoryview(outbox.file._mm).cast("I")
    rows[(outbox.file.views[0].base(0) + PREFIX_BYTES) // 4] = 10**6  # obs's row count
    outbox.send(1, {"split": 0, "seq": 2}, {"obs": OBS + 1})
    _, request = inbox.receive()
    assert request.meta["seq"] == 2 and rejects.count == 1 and outbox.status(0) == FREE
    rows.release()
    outbox.close()
    inbox.close()


def test_a_request_sent_again_takes_a_slot_no_live_server_answers(shm_dir: Path) -> None:
    """One writer per reply slot: a slow server's late answer lands in its own slot, never
    in the one the request was sent again into; a request still waiting unclaimed is
    withdrawn instead (its record is then stale), and one a live server holds is not."""
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    split = range(0, 2)
    assert outbox.open_slot(split) == 0 and outbox.send(0, {"split": 0, "seq": 1}, {"obs": OBS})
    slow, _ = inbox.receive()  # a server takes it, and is slow to answer
    again = outbox.open_slot(split)
    assert again == 1 and outbox.send(again, {"split": 0, "seq": 2}, {"obs": OBS + 1})
    assert outbox.open_slot(split) == 1, "waiting unclaimed: withdrawn to send again"
    assert outbox.status(1) == FREE and inbox.receive() is None and inbox.stale == 1
    assert outbox.send(1, {"split": 0, "seq": 3}, {"obs": OBS + 2})
    fast, request = inbox.receive()
    assert request.meta["seq"] == 3 and outbox.open_slot(split) is None, \
        "each slot held by a live server: nothing is overwritten"
    assert inbox.reply(fast, answer(3), ANSWER) and inbox.reply(slow, answer(1), ANSWER)
    assert [outbox.receive(rejects).meta["seq"] for _ in range(2)] == [3, 1]
    assert rejects.count == 0
    outbox.close()
    inbox.close()


def test_a_late_reply_to_a_withdrawn_request_is_dropped(shm_dir: Path) -> None:
    """A server that claimed a request just as the actor withdrew it sees the withdrawal
    and answers nothing; the slot is free once it has let go."""
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    outbox.send(0, {"split": 0, "seq": 1}, {"obs": OBS})
    route, _ = inbox.receive()
    assert not outbox._withdraw(0), "claimed by a live server: not free"
    assert not inbox.reply(route, answer(1), ANSWER) and inbox.stale == 1
    assert outbox.status(0) == FREE and outbox.receive(rejects) is None
    outbox.close()
    inbox.close()


def test_a_doorbell_read_with_a_cut_or_foreign_record_is_dropped_and_the_next_is_read(
        shm_dir: Path) -> None:
    """A writer that is not ours (or a cut write) shifts every record after it: the read
    is dropped with all the FIFO holds, and the bell reads in step again."""
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects, read_records=64)
    for garbage in (b"\x01" * 7, RECORD.pack(outbox.token, 0, MAGIC ^ 1, 1)):
        outbox.send(0, {"split": 0, "seq": 1}, {"obs": OBS})
        with open(inbox.bell.path, "wb", buffering=0) as fifo:
            fifo.write(garbage)
        assert inbox.receive() is None
        outbox.send(1, {"split": 0, "seq": 2}, {"obs": OBS})
        route, request = inbox.receive()
        assert request.meta["seq"] == 2
        inbox.release(route)
    assert inbox.bell.torn == 2 and rejects.count == 0
    outbox.close()
    inbox.close()


def test_a_peer_file_of_another_layout_is_refused(shm_dir: Path) -> None:
    rejects = RejectCounter()
    stem = shm_dir / "samples.test"
    bell = Path(f"{stem}.0.bell")
    inbox = Inbox(bell, stem, [CHUNK], 4, rejects)
    outbox = Outbox(stem, [bell], 4, REQUEST)  # requests where chunks are expected
    outbox.send(0, {"split": 0, "seq": 1}, {"obs": np.zeros((1, 4), np.float32)})
    assert inbox.receive(copy=True) is None
    assert rejects.count == 1 and not inbox.peers
    outbox.close()
    inbox.close()


def test_a_chunk_ring_fills_frees_and_takes_back_only_a_dead_readers_slot(
        shm_dir: Path) -> None:
    """A reader is dead when its lock is free, not when its pid is: a reader of this very
    process (alive, same pid) that has let go of its lock has its slot taken back."""
    inboxes, outbox = chunk_ends(shm_dir, binders=2)
    for actor in (3, 4):
        slot = outbox.free_slot()
        assert outbox.send(slot, {"actor": actor, "episode_returns": [1.5]}, CHUNK_ARRAYS)
    assert outbox.free_slot() is None, "both slots wait to be copied out"
    got = [inbox.receive(copy=True) for inbox in inboxes]  # spread over both binders
    assert [message.meta["actor"] for _, message in got] == [3, 4]
    assert got[0][1].meta["episode_returns"] == [1.5]
    assert outbox.free_slot() is not None
    for slot in (0, 1):
        assert outbox.send(slot, {"actor": slot}, CHUNK_ARRAYS)
    reader = place.HeldLock(place.presence_path(shm_dir, 0x5EED))  # a reader's presence
    for slot in (0, 1):
        outbox.file.set_claim(0, slot, outbox._stamp_of[slot], 0x5EED)
    assert outbox.free_slot() is None, "a live reader's slots are not taken back"
    assert outbox.status(0) == TAKEN and outbox.reclaimed == 0
    reader.release()
    assert outbox.free_slot() == 0 and outbox.reclaimed == 1, \
        "its lock released: its pid (this process's) still runs, and the slot is taken back"
    outbox.close()
    for inbox in inboxes:
        inbox.close()


def test_a_replayed_record_is_dropped_and_counted(shm_dir: Path) -> None:
    """Exactly once: a record for a chunk already copied out, or a request already
    answered, finds its slot done, not its message."""
    [inbox], outbox = chunk_ends(shm_dir)
    assert outbox.send(0, {"actor": 7}, CHUNK_ARRAYS)
    assert inbox.receive(copy=True)[1].meta["actor"] == 7
    replay(inbox.bell.path, outbox.token, 0, outbox._stamp_of[0])
    assert inbox.receive(copy=True) is None and inbox.stale == 1 and inbox.received == 1
    outbox.close()
    inbox.close()
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    outbox.send(0, {"split": 0, "seq": 1}, {"obs": OBS})
    route, _ = inbox.receive()
    replay(inbox.bell.path, outbox.token, 0, outbox._stamp_of[0])
    assert inbox.receive() is None and inbox.stale == 1, "claimed: not taken twice"
    assert inbox.reply(route, answer(1), ANSWER)
    replay(inbox.bell.path, outbox.token, 0, outbox._stamp_of[0])
    assert inbox.receive() is None and inbox.stale == 2, "answered: not taken again"
    assert outbox.receive(rejects).meta["seq"] == 1 and outbox.receive(rejects) is None
    outbox.close()
    inbox.close()


def test_a_chunk_left_unread_past_the_timeout_is_never_overwritten(shm_dir: Path) -> None:
    """`send_policy: block` blocks on shared memory as on ZeroMQ: a binder that reads
    nothing for the timeout (a rate limiter, a long compile) gets every chunk intact once
    it reads; the record rung again meanwhile is counted stale, not taken twice."""
    [inbox], outbox = chunk_ends(shm_dir, reclaim_after_s=0.05)
    for actor in (0, 1):
        assert outbox.send(outbox.free_slot(), {"actor": actor}, CHUNK_ARRAYS)
    time.sleep(0.1)
    assert outbox.free_slot() is None, "full slots wait past the timeout: none is reused"
    assert outbox.rerung == 2 and outbox.status(0) == WAITING
    got = [message.meta["actor"] for _, message in iter(lambda: inbox.receive(copy=True), None)]
    assert got == [0, 1] and inbox.stale == 2 and outbox.free_slot() is not None
    outbox.close()
    inbox.close()


def test_servers_sharing_a_bell_leave_requests_for_each_other(shm_dir: Path) -> None:
    """A server takes no more records than it serves: one that stalls after taking a
    request strands that one alone, and its peer serves the rest."""
    rejects = RejectCounter()
    stem = shm_dir / "inference.test"
    bell = Path(f"{stem}.bell")
    stalled, serving = (Inbox(bell, stem, [REQUEST, REPLY], 8, rejects, read_records=1)
                        for _ in range(2))
    outbox = Outbox(stem, [bell], 8, REQUEST, REPLY)
    for seq in range(8):
        assert outbox.send(seq, {"split": seq // 2, "seq": seq}, {"obs": OBS})
    assert stalled.receive()[1].meta["seq"] == 0
    served = []
    while (got := serving.receive(limit=2)) is not None:
        served.append(got[1].meta["seq"])
        assert serving.reply(got[0], answer(got[1].meta["seq"]), ANSWER)
    assert served == list(range(1, 8)) and stalled.stale == serving.stale == 0
    outbox.close()
    stalled.close()
    serving.close()


def test_a_reply_to_a_connecter_that_is_gone_is_counted_and_its_file_let_go(
        shm_dir: Path) -> None:
    """A request from a child process that exits before its answer."""
    rejects = RejectCounter()
    stem = shm_dir / "inference.test"
    bell = Path(f"{stem}.bell")
    inbox = Inbox(bell, stem, [REQUEST, REPLY], 4, rejects)
    code = ("import sys, numpy as np; from pathlib import Path\n"
            "from tests.test_shared_memory import REQUEST, REPLY\n"
            "from srl_jax.wire.shm.channels import Outbox\n"
            f"out = Outbox(Path({str(stem)!r}), [Path({str(bell)!r})], 4, REQUEST, REPLY)\n"
            "out.send(0, {'split': 0, 'seq': 1}, {'obs': np.zeros((1, 4), np.float32)})\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    route, _ = inbox.receive()
    assert inbox.mapped_bytes > 0
    assert not inbox.reply(route, answer(1, 1), {"action": np.zeros(1, np.int32)})
    assert inbox.lost_replies == 1 and not inbox.peers and inbox.mapped_bytes == 0
    assert sorted(place.sweep_dead_peers(shm_dir)) == sorted(
        peer_path(stem, route.peer.token, suffix) for suffix in ("slots", "reply"))
    assert sorted(p.name for p in shm_dir.iterdir()) == [bell.name, f"peer.{inbox.token:08x}"]
    inbox.close()


def test_a_connecter_that_reuses_a_pid_is_a_new_peer(shm_dir: Path) -> None:
    """Peers are their tokens: a new actor with a dead one's pid (here: the same process,
    its first ends closed) gets its own slots answered, not the old file's."""
    rejects = RejectCounter()
    inbox, first = ends(shm_dir, rejects)
    first.send(0, {"split": 0, "seq": 1}, {"obs": OBS})
    route, _ = inbox.receive()
    assert inbox.reply(route, answer(1), ANSWER) and first.receive(rejects) is not None
    first.close()
    assert [p.name for p in shm_dir.glob("peer.*")] == [f"peer.{inbox.token:08x}"], \
        "a closed end removed its presence"
    stem = shm_dir / "inference.test"
    second = Outbox(stem, [Path(f"{stem}.bell")], 4, REQUEST, REPLY)
    assert second.token != first.token
    second.send(0, {"split": 0, "seq": 9}, {"obs": OBS + 9})
    route, request = inbox.receive()
    assert request.meta["seq"] == 9 and request.arrays["obs"].max() == 9
    assert inbox.reply(route, answer(9), ANSWER) and second.receive(rejects).meta["seq"] == 9
    inbox.prune()
    assert list(inbox.peers) == [second.token], "the dead peer forgotten"
    second.send(1, {"split": 0, "seq": 10}, {"obs": OBS})
    route, _ = inbox.receive()
    second.close()
    inbox.prune()  # while the request waits in a batch: its reply is lost, nothing breaks
    assert not inbox.reply(route, answer(10), ANSWER) and inbox.lost_replies == 1
    inbox.release(route)
    assert inbox.mapped_bytes == 0
    inbox.prune()
    assert not inbox._forgotten, "unmapped a prune later"
    inbox.close()


def test_a_ringer_follows_its_bell_to_a_new_fifo(shm_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A binder restarted after its FIFO was replaced: the actors ring the new one (on a
    failed ring, and where the old one still has a reader, within a second); a stream
    that no bell answers for the handoff time is unreachable."""
    [first], outbox = chunk_ends(shm_dir, slots=4, handoff_after_s=0.05)
    assert outbox.send(outbox.free_slot(), {"actor": 1}, CHUNK_ARRAYS)
    assert first.receive(copy=True)[1].meta["actor"] == 1
    first.close()
    first.bell.path.unlink()
    assert not outbox.send(outbox.free_slot(), {"actor": 2}, CHUNK_ARRAYS), "no reader"
    time.sleep(0.1)
    assert outbox.unreachable
    [second], other = chunk_ends(shm_dir, slots=4)  # a new FIFO at the same path
    assert outbox.send(outbox.free_slot(), {"actor": 3}, CHUNK_ARRAYS)
    assert not outbox.unreachable and second.receive(copy=True)[1].meta["actor"] == 3
    monkeypatch.setattr(bell_module, "RECHECK_S", 0.0)
    second.bell.path.rename(shm_dir / "retired.bell")  # the old FIFO keeps its reader
    [third], another = chunk_ends(shm_dir, slots=4)
    assert outbox.send(outbox.free_slot(), {"actor": 4}, CHUNK_ARRAYS)
    assert third.receive(copy=True)[1].meta["actor"] == 4 and second.receive(copy=True) is None
    for connecter in (other, another, outbox):
        connecter.close()
    for inbox in (second, third):
        inbox.close()


def test_bells_and_directories_of_others_are_refused(shm_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing another user (or a mode open to all) made is used: an owner directory of
    mode 0777 or of another uid, a FIFO of mode 0666, a link in a bell's place; and an
    owner's name taken already is never reused."""
    for mode, uid in ((0o777, os.geteuid()), (0o700, 65534)):
        other = place.SHM_ROOT / f"{shm_dir.name}-{mode:o}"
        other.mkdir()
        os.chmod(other, mode)
        os.chown(other, uid, -1)
        monkeypatch.setenv(place.OWNER_ENV, str(other))
        try:
            assert owner_directory("auto") is None
            with pytest.raises(SharedMemoryUnavailable, match="refused"):
                owner_directory("on")
        finally:
            other.rmdir()
    fifo = shm_dir / "open.bell"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    with pytest.raises(place.NotPrivate, match="mode 666"):
        Bell(fifo)
    (shm_dir / "link.bell").symlink_to(fifo)
    with pytest.raises(OSError):
        Bell(shm_dir / "link.bell")
    (shm_dir / "link.bell").unlink()
    taken = place.SHM_ROOT / f"{place.DIR_PREFIX}{os.geteuid()}-{'ab' * 8}"
    taken.mkdir()
    os.chmod(taken, 0o777)
    monkeypatch.setattr(place.secrets, "token_hex", lambda _: "ab" * 8)
    try:
        with pytest.raises(FileExistsError):
            place.OwnerDirectory()
        assert stat.S_IMODE(taken.stat().st_mode) == 0o777, "left as it was"
    finally:
        taken.rmdir()


def test_a_sweep_removes_only_directories_no_live_owner_holds(tmp_path: Path) -> None:
    """Liveness by lock: a directory whose owner exited goes, even while a child it
    forked lives on (the child never holds its parent's lock); a live owner's stays
    whatever its pid; a lockless one goes only once it is old."""
    code = ("import os, sys, time\nfrom pathlib import Path\n"
            "from srl_jax.wire.shm.place import OwnerDirectory\n"
            f"owner = OwnerDirectory(Path({str(tmp_path)!r}))\n"
            "child = os.fork()\n"
            "if child == 0:\n    null = os.open(os.devnull, os.O_WRONLY)\n"
            "    os.dup2(null, 1)\n    os.dup2(null, 2)\n"
            "    time.sleep(60)\n    os._exit(0)\n"
            "print(child, flush=True)\nos._exit(0)\n")
    child = int(subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True,
                               capture_output=True, text=True).stdout)
    try:
        mine = place.OwnerDirectory(tmp_path)
        old, young = (tmp_path / f"{place.DIR_PREFIX}{os.geteuid()}-{n}" for n in ("1-1", "2-2"))
        old.mkdir(mode=0o700)
        young.mkdir(mode=0o700)
        os.utime(old, (time.time() - 2 * place.ORPHAN_AGE_S,) * 2)
        [orphaned] = [p for p in tmp_path.iterdir() if p not in (mine.path, old, young)]
        assert os.kill(child, 0) is None, "the forked child still runs"
        assert sorted(place.sweep_stale(tmp_path)) == sorted([orphaned, old])
        assert sorted(tmp_path.iterdir()) == sorted([mine.path, young])
        assert stat.S_IMODE(mine.path.stat().st_mode) == 0o700
        mine.remove()
        assert not mine.path.exists()
    finally:
        os.kill(child, 9)


def test_shared_memory_is_chosen_only_where_every_binder_shares_the_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: a binder registers its doorbell; a connecter of the same owner uses it, one
    of another owner (or with it off) uses ZeroMQ; on: a worker without an owner is an
    error; the config's on/off read from YAML's booleans."""
    owner = place.OwnerDirectory()
    monkeypatch.setenv(place.OWNER_ENV, str(owner.path))

    class Peer:  # what open_inbox and open_outbox read of a worker
        def __init__(self, kind_config: ExperimentConfig, index: int = 0) -> None:
            self.config, self.index, self.policy = kind_config, index, "default"
            self.names, self.rejects = FileNameService(tmp_path / "names"), RejectCounter()

    config = ExperimentConfig()
    inbox = open_inbox(Peer(config), INFERENCE, [REQUEST, REPLY], 4)
    try:
        bell = Peer(config).names.get(INFERENCE.bell_key(index=0))
        assert bell == SCHEME + str(inbox.bell.path) and inbox.bell.path.parent == owner.path
        outbox = open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY)
        assert outbox is not None
        outbox.close()
        config.transport.shared_memory = "off"
        assert open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY) is None
        config.transport.shared_memory = "auto"
        other = place.OwnerDirectory()  # another owner: another host's workers
        monkeypatch.setenv(place.OWNER_ENV, str(other.path))
        assert open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY) is None
        other.remove()
        monkeypatch.setenv(place.OWNER_ENV, str(owner.path))
        assert open_outbox(Peer(config), SAMPLES, 4, CHUNK) is None, "no learner rang"
        monkeypatch.delenv(place.OWNER_ENV)
        config.transport.shared_memory = "on"
        with pytest.raises(SharedMemoryUnavailable, match="no owner"):
            open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY)
    finally:
        inbox.close()
        owner.remove()
    assert not owner.path.exists()
    yaml = tmp_path / "on.yaml"
    yaml.write_text("stop: {env_frames: 100}\ntransport: {shared_memory: on}\n")
    assert load_config(yaml).transport.shared_memory == "on"
    assert load_config(yaml, ["transport.shared_memory=off"]).transport.shared_memory == "off"
    with pytest.raises(ConfigError, match="names a slot in 16 bits"):
        load_config(yaml, ["actors.send_queue=65537"])


def test_a_binder_that_leaves_its_records_unread_holds_no_more_than_its_share_of_the_ring(
        shm_dir: Path) -> None:
    """A replay server whose rate limiter holds inserts reads nothing; the actor's chunks
    must still reach the other server, which the learner may be waiting on."""
    (held, taking), outbox = chunk_ends(shm_dir, binders=2, slots=4)
    taken = []
    for actor in range(12):
        slot = outbox.free_slot()
        assert slot is not None and outbox.send(slot, {"actor": actor}, CHUNK_ARRAYS), actor
        while (got := taking.receive(copy=True)) is not None:
            taken.append(got[1].meta["actor"])
    assert taken == [1, 3, *range(4, 12)], "past its share, the held binder is skipped"
    assert [message.meta["actor"] for _, message in iter(held.receive, None)] == [0, 2]
    outbox.close()
    held.close()
    taking.close()


def test_the_run_is_sized_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's shared memory against /dev/shm's free space: auto falls back to ZeroMQ
    with one line naming the size and --shm-size; on is a config error; so is on for a
    backend that starts no owner."""
    config = ExperimentConfig()
    spec_of = {"default": SPEC}.get
    needed = budget.run_bytes(config, spec_of, 16)
    per_actor = budget.actor_bytes(config, SPEC, "default", 16)
    assert needed == config.actors.count * per_actor > 0
    assert budget.plan_shared_memory(config, "local", spec_of, 16) == (True, None)
    monkeypatch.setattr(budget, "free_bytes", lambda root: needed - 1)
    use, line = budget.plan_shared_memory(config, "local", spec_of, 16)
    assert not use and "--shm-size=64m" in line and f"needs {-(-needed // 1024)} KiB" in line
    config.transport.shared_memory = "on"
    with pytest.raises(ConfigError, match="shm-size"):
        budget.plan_shared_memory(config, "local", spec_of, 16)
    with pytest.raises(ConfigError, match="ray backend"):
        budget.plan_shared_memory(config, "ray", None, 16)
    config.transport.shared_memory = "off"
    assert budget.plan_shared_memory(config, "local", spec_of, 16) == (False, None)


SPLITS = 2
SLOTS_PER_SPLIT = 2
FULL_ANSWER = {"action": np.zeros(2, np.int32), "logp": np.zeros(2, np.float32),
               "value": np.zeros(2, np.float32)}


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket, zmq.Socket, zmq.Socket]]:
    """A ROUTER on loopback and two DEALERs connected to it."""
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealers = [context.socket(zmq.DEALER) for _ in range(2)]
    for dealer in dealers:
        dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, *dealers
    for socket in (router, *dealers):
        socket.close(linger=0)


def request_ends(shm_dir: Path, router: zmq.Socket, dealer: zmq.Socket,
                 handoff_after_s: float = 60.0) -> tuple[Binder, Connecter]:
    """The inference stream's ends through `shm_dir`, as `Worker.bind` and `Worker.connect`
    make them where binder and connecter share a host."""
    rejects = RejectCounter()
    stem = shm_dir / "inference.test"
    bell = Path(f"{stem}.bell")
    slots = SPLITS * SLOTS_PER_SPLIT
    inbox = Inbox(bell, stem, [REQUEST, REPLY], slots, rejects, read_records=1)
    binder = Binder(router, INFERENCE.binder_receives, rejects, inbox, envelope=1,
                    reply_kind="infer_reply")
    outbox = Outbox(stem, [bell], slots, REQUEST, REPLY, handoff_after_s=handoff_after_s)
    connecter = Connecter(dealer, "infer_request", INFERENCE.connecter_receives, rejects,
                          outbox, SLOTS_PER_SPLIT, "inference servers")
    return binder, connecter


def reply_to(connecter: Connecter, timeout_s: float = 5.0) -> dict:
    """The next reply's meta, polled as the actor polls."""
    poller = zmq.Poller()
    connecter.register(poller)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = dict(poller.poll(0 if connecter.pending else 50))
        if connecter.ready(events) and (reply := connecter.receive()) is not None:
            return reply.meta
    raise AssertionError("no reply came")


def test_a_binder_takes_from_both_transports_and_answers_each_by_its_route(
        shm_dir: Path, sockets: tuple[zmq.Socket, zmq.Socket, zmq.Socket]) -> None:
    router, near_dealer, far_dealer = sockets
    binder, near = request_ends(shm_dir, router, near_dealer)
    far = Connecter(far_dealer, "infer_request", INFERENCE.connecter_receives,
                    RejectCounter())  # a host of its own: ZeroMQ only
    try:
        assert near.send({"split": 1, "seq": 1}, {"obs": OBS}, split=1)
        assert far.send({"split": 0, "seq": 2}, {"obs": OBS})
        received = []
        deadline = time.monotonic() + 5
        while len(received) < 2 and time.monotonic() < deadline:
            if binder.wait(50) and (message := binder.receive(limit=1)) is not None:
                received.append(message)
        assert sorted(message.meta["seq"] for _, message in received) == [1, 2]
        assert {type(origin) for origin, _ in received} == {Route, list}
        for origin, message in received:
            binder.reply(origin, {"split": 0, "seq": message.meta["seq"], "version": 0,
                                  "batch_rows": 2}, FULL_ANSWER)
        assert reply_to(near)["seq"] == 1 and reply_to(far)["seq"] == 2
        assert binder.counters()["shm_received"] == 1
        assert near.counters()["shm_mib"] > 0 and far.counters()["shm_mib"] == 0
    finally:
        near.outbox.close()
        binder.inbox.close()


def test_a_request_refused_gives_its_slot_back(
        shm_dir: Path, sockets: tuple[zmq.Socket, zmq.Socket, zmq.Socket]) -> None:
    """Each split has its own slots: one whose requests are claimed and let go (`release`)
    can ask again, and a split's slots never take another's requests."""
    router, dealer, _ = sockets
    binder, connecter = request_ends(shm_dir, router, dealer)
    try:
        for seq in range(SLOTS_PER_SPLIT):
            assert connecter.send({"split": 0, "seq": seq}, {"obs": OBS}, split=0)
            origin, _ = binder.receive()
            assert type(origin) is Route and origin.slot < SLOTS_PER_SPLIT
        assert not connecter.send({"split": 0, "seq": 9}, {"obs": OBS}, split=0), \
            "both of split 0's slots are claimed by a live binder"
        assert connecter.send({"split": 1, "seq": 9}, {"obs": OBS}, split=1)
        binder.release(origin)
        assert connecter.send({"split": 0, "seq": 10}, {"obs": OBS}, split=0)
    finally:
        connecter.outbox.close()
        binder.inbox.close()


def test_a_connecter_whose_binders_cannot_be_rung_hands_the_stream_to_zeromq(
        shm_dir: Path, sockets: tuple[zmq.Socket, zmq.Socket, zmq.Socket],
        caplog: pytest.LogCaptureFixture) -> None:
    """Its requests go on the socket from then on and their replies are polled there;
    the slots handed over still count."""
    router, dealer, _ = sockets
    binder, connecter = request_ends(shm_dir, router, dealer, handoff_after_s=0.05)
    poller = zmq.Poller()
    connecter.register(poller)
    binder.inbox.close()
    binder.inbox.bell.path.unlink()
    try:
        assert not connecter.send({"split": 0, "seq": 1}, {"obs": OBS}), "no reader"
        time.sleep(0.1)
        with caplog.at_level(logging.WARNING):
            assert connecter.send({"split": 0, "seq": 2}, {"obs": OBS})
        assert "ZeroMQ carries the stream from now on" in caplog.text
        assert router.poll(5000)
        plain = Binder(router, INFERENCE.binder_receives, RejectCounter(), envelope=1,
                       reply_kind="infer_reply")
        origin, message = plain.receive()
        assert type(origin) is list and message.meta["seq"] == 2
        plain.reply(origin, {"split": 0, "seq": 2, "version": 0, "batch_rows": 2}, FULL_ANSWER)
        assert poller.poll(5000) and connecter.ready(dict(poller.poll(0)))
        assert connecter.receive().meta["seq"] == 2
        assert connecter.counters() == {"shm_mib": 0.0, "shm_reclaimed": 0, "shm_rerung": 0,
                                        "shm_handoffs": 1}
    finally:
        connecter.retired.close()
