"""Replay shards sampled as one prioritized memory (learners/intake/replay_intake.py).

Two real replay servers (`ReplayWorker`, in this process, on real sockets) answer a
learner's `ReplayIntake`: one holds ten times the transitions of the other, as after a
restart refilled it. Prioritized replay draws one distribution over the whole memory, so
the small shard gives a tenth of each batch, not half, and every row's importance weight
is the same where every priority is. A restarted server's new memory ignores the priority
updates meant for its predecessor's, even where its slots and insert counts coincide.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zmq

from actors.envs import policy_spec
from learners.intake.replay_intake import SILENCE_S, ReplayIntake, allocate
from replay.replay_worker import ReplayWorker
from srl_jax.config.loader import config_dirs, load_config, resolve_experiment_path
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import algorithm, sampled_fields, sampled_window
from srl_jax.dataflow.stream_table import REPLAY
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter

ROWS = 128
WINDOW = 3


def dqn_config() -> ExperimentConfig:
    return load_config(resolve_experiment_path("cartpole_dqn", config_dirs()),
                       ["replay.count=2", "replay.min_size=512",
                        "replay.samples_per_insert=1000", "actors.splits=2"])  # 128 a chunk


def fill(server: ReplayWorker, chunks: int, seed: int) -> None:
    """`chunks` chunks of random CartPole steps straight into the server's memory."""
    rng = np.random.default_rng(seed)
    T, n = server.layout["actions"][0][:2]
    for _ in range(chunks):
        chunk = {name: np.zeros(shape, dtype) for name, (shape, dtype) in server.layout.items()}
        chunk["obs"][:] = rng.random((T + 1, n, 4), np.float32)
        chunk["actions"][:] = rng.integers(0, 2, (T, n))
        chunk["rewards"][:] = 1.0
        chunk["active"][:] = True
        chunk["priorities"][:] = 1.0  # the actors' TD errors (cartpole_dqn: Ape-X's)
        server.limiter.inserted(server.buffer.insert(chunk))


def connect(context: zmq.Context, names: FileNameService, servers: int) -> list[zmq.Socket]:
    sockets = []
    for index in range(servers):
        socket = context.socket(zmq.DEALER)
        socket.connect(names.lookup(REPLAY.key("default", index), 5.0))
        sockets.append(socket)
    return sockets


def batches(intake: ReplayIntake, servers: list[ReplayWorker], count: int) -> list[dict]:
    taken, deadline = [], time.monotonic() + 30
    while len(taken) < count and time.monotonic() < deadline:
        intake.pump(1, 0)
        for server in servers:
            server.run_once()
        if (batch := intake.take_batch(0)) is not None:
            taken.append(batch)
    assert len(taken) == count, f"{len(taken)} of {count} batches in 30 s"
    return taken


def test_allocation_follows_total_priority_and_knows_no_share_for_the_unheard() -> None:
    rng = np.random.default_rng(0)
    shares = np.mean([allocate(ROWS, [200.0, 20.0], rng) for _ in range(2000)], 0) / ROWS
    np.testing.assert_allclose(shares, [10 / 11, 1 / 11], atol=0.005)
    unheard = np.mean([allocate(ROWS, [None, 30.0, 10.0], rng) for _ in range(2000)], 0) / ROWS
    np.testing.assert_allclose(unheard, [1 / 3, 0.5, 1 / 6], atol=0.01)
    assert (allocate(ROWS, [0.0, 0.0], rng) > 0).all()  # all refilling: equal shares
    assert allocate(ROWS, [5.0, 0.0], rng).tolist() == [ROWS, 0]


def test_a_refilled_shard_gives_its_share_of_the_memory_and_weights_are_global(
        tmp_path: Path) -> None:
    config = dqn_config()
    names = FileNameService(tmp_path / "names")
    servers = [ReplayWorker(config, i, tmp_path, names) for i in range(2)]
    for server in servers:
        server.setup()
    fill(servers[0], 300, seed=0)
    fill(servers[1], 30, seed=1)  # a tenth: as after a restart, refilling
    context = zmq.Context.instance()
    sockets = connect(context, names, 2)
    spec = policy_spec(config, "default")
    intake = ReplayIntake(sockets, [REPLAY.key("default", i) for i in range(2)], ROWS,
                          WINDOW, spec, config.replay.importance_exponent, RejectCounter(), 0,
                          seed=0)
    try:
        taken = batches(intake, servers, 62)[2:]  # the first rounds: equal shares, unheard
        sizes = [s.buffer.size for s in servers]
        assert sizes == [300 * 128, 30 * 128]
        small = np.mean([np.mean(b["shards"] == 1) for b in taken])
        assert abs(small - 1 / 11) < 0.02, f"the refilled shard gave {small:.3f} of the rows"
        # Every priority is the same, so is every row's weight over the whole memory: the
        # shard's share (n_k / B, against T_k / sum T) is all that moves it.
        for batch in taken:
            normalized = batch["weights"] / batch["weights"].max()
            assert normalized.min() > 0.6, normalized.min()
        by_shard = [np.mean([(b["weights"] / b["weights"].max())[b["shards"] == k].mean()
                             for b in taken if (b["shards"] == k).any()]) for k in (0, 1)]
        assert abs(by_shard[0] - by_shard[1]) < 0.1, by_shard
        assert {int(i) for b in taken for i in b["memory_ids"][b["shards"] == 1]} == {
            servers[1].memory_id}
    finally:
        for socket in sockets:
            socket.close(linger=0)
        for server in servers:
            server.close()


def test_a_restarted_servers_memory_ignores_updates_meant_for_its_predecessor(
        tmp_path: Path) -> None:
    config = dqn_config()
    names = FileNameService(tmp_path / "names")
    before = ReplayWorker(config, 0, tmp_path, names)
    fill(before, 10, seed=0)
    batch = before.buffer.sample(ROWS, WINDOW)
    after = ReplayWorker(config, 0, tmp_path, names)  # the successor: the same inserts
    fill(after, 10, seed=0)
    assert (after.buffer.generations == before.buffer.generations).all()
    update = {"slots": batch["slots"], "generations": batch["generations"],
              "priorities": np.full(ROWS, 50.0, np.float32)}
    tree = after.buffer.tree.nodes.copy()
    after._update_priorities({"memory_id": before.memory_id}, update)
    assert (after.buffer.tree.nodes == tree).all()
    assert after.priorities_stale == ROWS and after.priority_updates == 0
    after._update_priorities({"memory_id": after.memory_id}, update)
    assert after.priority_updates == 1 and after.buffer.max_priority == 50.0
    after._update_priorities({}, update)  # no memory named: malformed
    assert after.rejects.count == 1


def test_a_silent_server_gets_no_share_until_it_answers(tmp_path: Path) -> None:
    config = dqn_config()
    names = FileNameService(tmp_path / "names")
    servers = [ReplayWorker(config, i, tmp_path, names) for i in range(2)]
    for server in servers:
        server.setup()
        fill(server, 30, seed=server.index)
    sockets = connect(zmq.Context.instance(), names, 2)
    intake = ReplayIntake(sockets, [REPLAY.key("default", i) for i in range(2)], ROWS,
                          WINDOW, policy_spec(config, "default"),
                          config.replay.importance_exponent, RejectCounter(), 0, seed=0)
    try:
        batches(intake, servers, 4)
        for _ in range(3):  # take the answers on their way, then ask again
            while intake.take_batch(0) is not None:
                pass
            intake.pump(0, 0)
        assert all(server.inflight for server in intake.servers), "asked, no answer yet"
        for server in intake.servers:
            server.last_heard -= SILENCE_S + 1  # as if server 1 had died: asked, silent
        intake.servers[0].last_heard += SILENCE_S + 1
        intake.pump(0, 0)
        assert intake.servers[1].gone and intake.timeouts == 1
        served = batches(intake, servers[:1], 4)  # server 1 answers nothing meanwhile
        assert all((b["shards"] == 0).all() for b in served)
        deadline = time.monotonic() + 10
        while intake.servers[1].gone and time.monotonic() < deadline:
            batches(intake, servers, 1)  # asked for its figures, it answers: back in
        assert not intake.servers[1].gone
        assert any((b["shards"] == 1).any() for b in batches(intake, servers, 8))
    finally:
        for socket in sockets:
            socket.close(linger=0)
        for server in servers:
            server.close()


def test_a_round_of_several_batches_spans_the_memory_in_each_and_sends_priorities_once(
        tmp_path: Path) -> None:
    """`replay.batches_per_request`: one request per server gives 4 batches; each takes
    every 4th row of the stratified sample, so each spans the whole memory (a contiguous
    quarter would hold a quarter of it), and the priorities of 4 updates go back in one
    message per server."""
    config = dqn_config()
    names = FileNameService(tmp_path / "names")
    servers = [ReplayWorker(config, i, tmp_path, names) for i in range(2)]
    for seed, server in enumerate(servers):
        server.setup()
        fill(server, 100, seed=seed)  # equal priorities: strata follow the slots
    context = zmq.Context.instance()
    sockets = connect(context, names, 2)
    intake = ReplayIntake(sockets, [REPLAY.key("default", i) for i in range(2)], ROWS,
                          WINDOW, policy_spec(config, "default"),
                          config.replay.importance_exponent, RejectCounter(), 0, seed=0,
                          batches=4)
    try:
        taken = batches(intake, servers, 8)
        size = servers[0].buffer.size
        for batch in taken:
            assert len(batch["shards"]) == ROWS
            for shard in (0, 1):
                slots = batch["slots"][batch["shards"] == shard]
                assert slots.min() < size / 4 and slots.max() >= 3 * size / 4, "spans it all"
        counts = [np.bincount(b["shards"], minlength=2).tolist() for b in taken]
        assert counts[:4] == [counts[0]] * 4 and counts[4:] == [counts[4]] * 4
        for batch in taken[:4]:
            assert sum(s.priority_updates for s in servers) == 0
            intake.trained({name: batch[name] for name in intake.kept},
                           np.full(ROWS, 5.0, np.float32))
        deadline = time.monotonic() + 10
        while sum(s.priority_updates for s in servers) < 2 and time.monotonic() < deadline:
            for server in servers:
                server.run_once()
        assert [s.priority_updates for s in servers] == [1, 1]
        assert all(s.buffer.max_priority == 5.0 for s in servers)
    finally:
        for socket in sockets:
            socket.close(linger=0)
        for server in servers:
            server.close()


def test_teams_come_whole_from_every_server_and_every_batch_of_a_round(tmp_path: Path) -> None:
    """QMIX's team replay (`Replay.teams`): rows are allocated between the servers, and
    dealt out to the batches of a round, in whole teams of an env's 3 agents, in order."""
    config = load_config(resolve_experiment_path("mpe_spread_qmix", config_dirs()),
                         ["replay.count=2", "replay.min_size=300",
                          "replay.samples_per_insert=1000"])
    names = FileNameService(tmp_path / "names")
    servers = [ReplayWorker(config, i, tmp_path, names) for i in range(2)]
    for server in servers:
        server.setup()
        n = server.layout["actions"][0][1]
        for _ in range(4):
            chunk = {name: np.zeros(shape, dtype)
                     for name, (shape, dtype) in server.layout.items()}
            chunk["rewards"][:] = np.arange(n)  # each column says which it is
            chunk["active"][:] = True
            server.limiter.inserted(server.buffer.insert(chunk))
    context = zmq.Context.instance()
    sockets = connect(context, names, 2)
    spec = policy_spec(config, "default")
    intake = ReplayIntake(sockets, [REPLAY.key("default", i) for i in range(2)], 48,
                          sampled_window(config), spec, 0.0, RejectCounter(), 0, seed=0,
                          fields=sampled_fields(algorithm("qmix")), batches=2, team=spec.agents)
    try:
        for batch in batches(intake, servers, 4):
            assert len(batch["shards"]) == 48
            for routing in ("shards", "slots"):
                teams = batch[routing].reshape(-1, 3)
                assert (teams == teams[:, :1]).all(), routing
            columns = batch["rewards"][:, 0].reshape(-1, 3)
            assert (columns == columns[:, :1] + np.arange(3)).all(), "an env's agents, in order"
    finally:
        for socket in sockets:
            socket.close(linger=0)
        for server in servers:
            server.close()
