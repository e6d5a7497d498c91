"""Same-host streams through shared memory (srl_jax/core/shm/): both ends of the
inference and chunk streams over real files in /dev/shm and real FIFOs, the wire's rules
on a slot (bounded rows, a peer of another layout refused, counted and dropped), stale
and dead peers, and the sweeps that leave nothing behind. Runs that kill workers and
controllers with shared memory on: tests/test_faults.py and tests/test_run.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from srl_jax.config.loader import load_config
from srl_jax.config.schema import ExperimentConfig
from srl_jax.core.env_spec import EnvSpec
from srl_jax.core.names import FileNameService
from srl_jax.core.shm import place
from srl_jax.core.shm.attach import SCHEME, open_inbox, open_outbox
from srl_jax.core.shm.bell import MAGIC, RECORD
from srl_jax.core.shm.channels import Inbox, Outbox, peer_path
from srl_jax.core.shm.layout import PREFIX_BYTES
from srl_jax.core.shm.slot_file import FREE, TAKEN
from srl_jax.core.shm.stream_layouts import chunk_slot_layout, reply_layout, request_layout
from srl_jax.core.stream_table import INFERENCE, SAMPLES
from srl_jax.core.streams import RejectCounter
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not place.available(), reason="needs /dev/shm and /proc")

SPEC = EnvSpec(obs_shape=(4,), obs_dtype=np.dtype(np.float32), action_dim=2, continuous=False)
CONFIG = ExperimentConfig()
CONFIG.selfplay.opponents = {"default": "trained"}  # a policy with every field: opponents
REQUEST, REPLY = request_layout(CONFIG, SPEC, "default"), reply_layout(CONFIG, SPEC, "default")
CHUNK = chunk_slot_layout({"obs": ((9, 4, 4), np.dtype(np.float32)),
                           "rewards": ((8, 4), np.dtype(np.float32))}, max_returns=16)


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    """A directory in /dev/shm of the test's own, removed with what is left in it."""
    directory = place.SHM_ROOT / f"srl_jax-test-{os.getpid()}-{tmp_path.name}"
    directory.mkdir(mode=0o700)
    yield directory
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()


def ends(shm_dir: Path, rejects: RejectCounter, slots: int = 4
         ) -> tuple[Inbox, Outbox]:
    stem = shm_dir / "inference.test"
    bell = Path(f"{stem}.bell")
    return Inbox(bell, stem, [REQUEST, REPLY], slots, rejects), \
        Outbox(stem, [bell], slots, REQUEST, REPLY)


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
    reply = {"action": np.array([1, 0, 1], np.int32), "logp": np.zeros(3, np.float32),
             "value": np.ones(3, np.float32)}
    assert inbox.reply(route, {"split": 0, "seq": 1, "version": 7, "batch_rows": 3,
                               "pool": [2, 5]}, reply)
    answer = outbox.receive(rejects)
    assert answer.meta == {"split": 0, "seq": 1, "version": 7, "batch_rows": 3, "pool": [2, 5]}
    np.testing.assert_array_equal(answer.arrays["action"], reply["action"])
    assert outbox.receive(rejects) is None and inbox.receive() is None
    assert rejects.count == 0 and inbox.stale == 0
    outbox.close()
    inbox.close()


def test_a_message_that_does_not_fit_its_layout_is_refused_by_the_writer(
        shm_dir: Path) -> None:
    inbox, outbox = ends(shm_dir, RejectCounter())
    with pytest.raises(ValueError, match="do not fit"):
        outbox.send(0, {"split": 0, "seq": 1}, {"obs": np.zeros((3, 5), np.float32)})
    too_many = np.zeros((CONFIG.inference.max_batch + 1, 4), np.float32)
    with pytest.raises(ValueError, match="do not fit"):
        outbox.send(0, {"split": 0, "seq": 1}, {"obs": too_many})
    outbox.close()
    inbox.close()


def test_a_slot_with_rows_past_its_bound_is_counted_and_dropped(shm_dir: Path) -> None:
    """The row count is what a slot's reader takes from shared memory: out of bounds,
    the message is malformed (counted once, as a socket's would be) and the next one
    is read."""
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    outbox.send(0, {"split": 0, "seq": 1}, {"obs": np.zeros((2, 4), np.float32)})
    rows = memoryview(outbox.file._mm).cast("I")
    rows[(outbox.file.views[0].base(0) + PREFIX_BYTES) // 4] = 10**6  # obs's row count
    outbox.send(1, {"split": 0, "seq": 2}, {"obs": np.ones((2, 4), np.float32)})
    _, request = inbox.receive()
    assert request.meta["seq"] == 2 and rejects.count == 1
    rows.release()
    outbox.close()
    inbox.close()


def test_a_slot_rewritten_before_it_is_read_is_stale_and_a_late_reply_is_dropped(
        shm_dir: Path) -> None:
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    obs = np.zeros((2, 4), np.float32)
    outbox.send(0, {"split": 0, "seq": 2}, {"obs": obs})
    route, _ = inbox.receive()
    outbox.send(0, {"split": 0, "seq": 4}, {"obs": obs + 1})  # sent again, same slot
    assert not inbox.reply(route, {"split": 0, "seq": 2, "version": 0, "batch_rows": 2},
                           {"action": np.zeros(2, np.int32)})
    assert outbox.receive(rejects) is None
    route, request = inbox.receive()
    assert request.meta["seq"] == 4 and inbox.stale == 1 and rejects.count == 0
    outbox.close()
    inbox.close()


def test_a_doorbell_read_with_a_cut_or_foreign_record_is_dropped_and_the_next_is_read(
        shm_dir: Path) -> None:
    """A writer that is not ours (or a cut write) shifts every record after it: the read
    is dropped with all the FIFO holds, and the bell reads in step again."""
    rejects = RejectCounter()
    inbox, outbox = ends(shm_dir, rejects)
    obs = np.zeros((1, 4), np.float32)
    for garbage in (b"\x01" * 7, RECORD.pack(os.getpid(), 0, MAGIC ^ 1, 1)):
        outbox.send(0, {"split": 0, "seq": 1}, {"obs": obs})
        with open(inbox.bell.path, "wb", buffering=0) as fifo:
            fifo.write(garbage)
        assert inbox.receive() is None
        outbox.send(1, {"split": 0, "seq": 2}, {"obs": obs})
        assert inbox.receive()[1].meta["seq"] == 2
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


def test_a_chunk_ring_fills_frees_and_takes_back_a_dead_readers_slot(shm_dir: Path) -> None:
    rejects = RejectCounter()
    stem = shm_dir / "samples.test"
    bells = [Path(f"{stem}.{i}.bell") for i in range(2)]
    inboxes = [Inbox(bell, stem, [CHUNK], 2, rejects) for bell in bells]
    outbox = Outbox(stem, bells, 2, CHUNK)
    chunk = {"obs": np.ones((9, 4, 4), np.float32), "rewards": np.ones((8, 4), np.float32)}
    for actor in (3, 4):
        slot = outbox.free_slot()
        assert outbox.send(slot, {"actor": actor, "episode_returns": [1.5]}, chunk)
    assert outbox.free_slot() is None, "both slots wait to be copied out"
    got = [inbox.receive(copy=True) for inbox in inboxes]  # spread over both binders
    assert [message.meta["actor"] for _, message in got] == [3, 4]
    assert got[0][1].meta["episode_returns"] == [1.5]
    chunk["obs"][:] = 9  # the reader's copy does not change with the slot
    assert got[0][1].arrays["obs"].max() == 1
    assert outbox.free_slot() is not None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    for slot in (0, 1):
        outbox.file.set_state(0, slot, TAKEN, reader=int(dead.stdout))
    assert outbox.free_slot() == 0, "the slot of a reader that died is taken back"
    outbox.file.set_state(0, 0, TAKEN, reader=os.getpid())
    outbox.file.set_state(0, 1, TAKEN, reader=os.getpid())
    assert outbox.free_slot() is None, "a live reader's slot is not"
    outbox.file.set_state(0, 1, FREE)
    outbox.close()
    for inbox in inboxes:
        inbox.close()


def test_a_reply_to_a_connecter_that_is_gone_is_counted_and_its_file_let_go(
        shm_dir: Path) -> None:
    """A request from a child process that exits before its answer."""
    rejects = RejectCounter()
    stem = shm_dir / "inference.test"
    bell = Path(f"{stem}.bell")
    inbox = Inbox(bell, stem, [REQUEST, REPLY], 4, rejects)
    code = ("import sys, numpy as np; from pathlib import Path\n"
            "from tests.test_shared_memory import REQUEST, REPLY\n"
            "from srl_jax.core.shm.channels import Outbox\n"
            f"out = Outbox(Path({str(stem)!r}), [Path({str(bell)!r})], 4, REQUEST, REPLY)\n"
            "out.send(0, {'split': 0, 'seq': 1}, {'obs': np.zeros((1, 4), np.float32)})\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    route, _ = inbox.receive()
    assert not inbox.reply(route, {"split": 0, "seq": 1, "version": 0, "batch_rows": 1},
                           {"action": np.zeros(1, np.int32)})
    assert inbox.lost_replies == 1 and not inbox.peers
    assert sorted(place.sweep_dead_peers(shm_dir)) == sorted(
        peer_path(stem, route.peer.pid, suffix) for suffix in ("slots", "reply"))
    assert sorted(p.name for p in shm_dir.iterdir()) == [bell.name]
    inbox.close()


def test_owner_directories_of_exited_owners_are_swept_and_live_ones_kept(
        tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = place.make_owner_dir(os.getpid(), tmp_path)
        theirs = place.make_owner_dir(gone.pid, tmp_path)
        (theirs / "inference.x.bell").write_text("")
        recycled = tmp_path / f"{place.DIR_PREFIX}{os.getuid()}-{os.getpid()}-1"
        recycled.mkdir()  # this pid, another start: an owner whose pid was reused
    finally:
        gone.kill()
        gone.wait()
    assert sorted(place.sweep_stale(tmp_path)) == sorted([theirs, recycled])
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]
    assert oct(mine.stat().st_mode & 0o777) == "0o700"


def test_shared_memory_is_chosen_only_where_every_binder_shares_the_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: a binder registers its doorbell; a connecter of the same owner uses it, one
    of another owner (or with it off) uses ZeroMQ; on: a host without /dev/shm is an
    error; the config's on/off read from YAML's booleans."""
    monkeypatch.setenv(place.OWNER_ENV, str(os.getpid()))

    class Peer:  # what open_inbox and open_outbox read of a worker
        def __init__(self, kind_config: ExperimentConfig, index: int = 0) -> None:
            self.config, self.index, self.policy = kind_config, index, "default"
            self.names, self.rejects = FileNameService(tmp_path / "names"), RejectCounter()

    config = ExperimentConfig()
    directory = place.owner_dir(os.getpid())
    inbox = open_inbox(Peer(config), INFERENCE, [REQUEST, REPLY], 4)
    try:
        bell = Peer(config).names.get(INFERENCE.bell_key(index=0))
        assert bell == SCHEME + str(inbox.bell.path) and inbox.bell.path.parent == directory
        outbox = open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY)
        assert outbox is not None
        outbox.close()
        config.transport.shared_memory = "off"
        assert open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY) is None
        config.transport.shared_memory = "auto"
        monkeypatch.setenv(place.OWNER_ENV, "1")  # another owner: another host's workers
        assert open_outbox(Peer(config), INFERENCE, 4, REQUEST, REPLY) is None
        monkeypatch.setenv(place.OWNER_ENV, str(os.getpid()))
        assert open_outbox(Peer(config), SAMPLES, 4, CHUNK) is None, "no learner rang"
    finally:
        inbox.close()
        place.remove_own()
    assert not directory.exists()
    yaml = tmp_path / "on.yaml"
    yaml.write_text("stop: {env_frames: 100}\ntransport: {shared_memory: on}\n")
    assert load_config(yaml).transport.shared_memory == "on"
    assert load_config(yaml, ["transport.shared_memory=off"]).transport.shared_memory == "off"


def test_a_binder_that_leaves_its_records_unread_holds_no_more_than_its_share_of_the_ring(
        shm_dir: Path) -> None:
    """A replay server whose rate limiter holds inserts reads nothing; the actor's chunks
    must still reach the other server, which the learner may be waiting on."""
    stem = shm_dir / "inserts.test"
    bells = [Path(f"{stem}.{i}.bell") for i in range(2)]
    held, taking = (Inbox(bell, stem, [CHUNK], 4, RejectCounter()) for bell in bells)
    outbox = Outbox(stem, bells, 4, CHUNK)
    chunk = {"obs": np.ones((9, 4, 4), np.float32), "rewards": np.ones((8, 4), np.float32)}
    taken = []
    for actor in range(12):
        slot = outbox.free_slot()
        assert slot is not None and outbox.send(slot, {"actor": actor}, chunk), actor
        while (got := taking.receive(copy=True)) is not None:
            taken.append(got[1].meta["actor"])
    assert taken == [1, 3, *range(4, 12)], "past its share, the held binder is skipped"
    assert [message.meta["actor"] for _, message in iter(held.receive, None)] == [0, 2]
    outbox.close()
    held.close()
    taking.close()
