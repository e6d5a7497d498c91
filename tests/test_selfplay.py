"""Self-play: frozen policies, the trained policy's opponent pool, and opponents drawn per episode.

The bookkeeping (which versions a pool keeps, how a draw maps to a snapshot, what a
restarted learner finds, how a server acts each row with its snapshot) is tested on
arrays; one real run of configs/rps_selfplay.yaml shows the whole loop: the frozen
policy has no learner and never changes, its servers hold exact copies of the
trained policy's snapshots, and its episodes play several of them.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import zmq
from etils import epath

from actors.env_ring import StepResult
from actors.envs import policy_spec
from actors.opponents import OpponentDraws, ended_envs
from learners.models.param_codec import params_to_arrays
from policy.acting import make_runner
from policy.export import load_policy
from policy.pool_runner import PoolRunner, PoolSubscriber
from srl_jax.config.loader import load_config
from srl_jax.config.opponent_pool import SnapshotPool, nearest_held, pick_version
from srl_jax.config.schema import ConfigError, acting_policies, run_policies
from srl_jax.dataflow.worker_kinds import worker_plan
from srl_jax.launch import check_before_launch
from srl_jax.runtime.run_dir import checkpoint_steps, pool_root, read_status
from srl_jax.wire.streams import RejectCounter, send
from tests.conftest import REPO, stop_when, wait_for

RPS = REPO / "configs" / "rps_selfplay.yaml"


def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"params/w": np.full((2, 3), value, np.float32), "params/b": np.zeros(3, np.float32)}


def test_a_pool_keeps_every_nth_version_the_newest_of_them_and_brings_them_back(tmp_path):
    directory = epath.Path(tmp_path / "pool")
    pool = SnapshotPool(every=10, size=3, directory=directory)
    for version in range(0, 61):
        if pool.due(version):
            pool.add(version, _arrays(version))
    assert pool.versions == [40, 50, 60]
    assert not pool.due(60) and not pool.due(61) and pool.due(70)
    assert sorted(p.name for p in directory.iterdir()) == ["40.npz", "50.npz", "60.npz"]
    assert {pool.next_to_republish() for _ in range(3)} == {40, 50, 60}, "each in turn"

    restarted = SnapshotPool(every=10, size=3, directory=directory)
    restarted.load(up_to=60)
    assert restarted.versions == [40, 50, 60]
    for version in restarted.versions:
        for name, array in _arrays(version).items():
            np.testing.assert_array_equal(restarted.snapshots[version][name], array)

    behind = SnapshotPool(every=10, size=2, directory=directory)
    behind.load(up_to=55)  # restored from an older checkpoint: it makes 60 anew
    assert behind.versions == [40, 50] and behind.due(60)
    assert sorted(p.name for p in directory.iterdir()) == ["40.npz", "50.npz"]


def test_a_draw_maps_uniformly_onto_the_pool_and_a_server_acts_with_the_nearest_it_holds():
    versions = [0, 10, 20, 30]
    assert [pick_version(u, versions) for u in (0.0, 0.24, 0.25, 0.74, 0.999)] == \
        [0, 0, 10, 20, 30]
    draws = [pick_version(u, versions) for u in np.random.default_rng(0).random(4000)]
    assert np.bincount(np.asarray(draws) // 10).min() > 900, "each about a quarter"
    assert [nearest_held(v, [20, 30]) for v in (30, 25, 10)] == [30, 20, 20]


def _step(terminated: list[bool], truncated: list[bool]) -> StepResult:
    n = len(terminated)
    return StepResult(np.zeros(n, np.float32), np.asarray(terminated), np.asarray(truncated),
                      np.zeros((n, 1)), np.empty(0, np.int64), np.empty((0, 1)))


def test_an_actor_draws_a_snapshot_per_env_and_episode_and_reports_the_one_that_acted():
    # Two envs, the frozen policy with 2 agents each; the trained one with 1.
    draws = OpponentDraws(envs=2, agents=2, rng=np.random.default_rng(1))
    assert draws.requested.tolist() == [0, 0, 0, 0], "before the pool is known: version 0"
    reply = {"pool": [0, 10, 20]}
    assert draws.take_reply(reply, {"opponent": np.zeros(4, np.int64)}, 4) is None
    assert draws.played == [0, 0] and draws.pool == [0, 10, 20]
    assert draws.take_reply({"pool": "x"}, {"opponent": np.zeros(4, np.int64)}, 4)
    assert draws.take_reply(reply, {"opponent": np.zeros(3, np.int64)}, 4)

    # Env 1's episode ends (every column of both policies done), env 0's goes on though
    # its frozen agents are out of play.
    frozen = _step([True, True, False, True], [False, False, True, False])
    trained = _step([False, True], [False, False])
    ended = ended_envs([frozen, trained], [2, 1])
    assert ended.tolist() == [1]
    draws.draw(ended)
    first = int(draws.requested[2])
    assert draws.requested[:2].tolist() == [0, 0] and draws.requested[3] == first
    assert first in (0, 10, 20)
    acted = np.asarray([0, 0, 10, 10], np.int64)  # the server held 10 where first was asked
    assert draws.take_reply(reply, {"opponent": acted}, 4) is None
    assert draws.played == [0, 0, 10] and draws.requested.tolist() == [0, 0, 10, 10], \
        "the episode keeps the snapshot that acted"
    assert draws.take_reply(reply, {"opponent": acted}, 4) is None
    assert draws.played == [0, 0, 10], "one entry per episode"


def test_a_pool_server_acts_each_row_with_its_snapshot():
    config = load_config(RPS, [])
    spec = policy_spec(config, "opponent")
    seed = params_to_arrays(make_runner(config, spec, 0, 8, 32).params)
    runner = make_runner(config, spec, 0, 8, 32, published=True)  # a server's: shapes alone
    pool = PoolRunner(runner)
    assert pool.versions == [], "nothing held before the pool's first snapshot"
    other = {name: array + 0.5 for name, array in seed.items()}
    pool.take(0, 1, [0], seed)
    pool.take(10, 1, [0, 10], other)
    assert pool.versions == [0, 10]
    obs = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1]]
    state, mask = runner.zero_state(6), runner.all_legal(6)
    outputs, newest = pool.run(obs, state, mask, np.asarray([0, 10, 0, 10, 5, 30], np.int64))
    assert newest == 10
    assert outputs["opponent"].tolist() == [0, 10, 0, 10, 0, 10], "5 and 30: the nearest held"
    for version, arrays in ((0, seed), (10, other)):
        runner.set_params(arrays, version)
        alone, _ = runner.run(obs, state, mask)
        rows = outputs["opponent"] == version
        np.testing.assert_array_equal(outputs["value"][rows], alone["value"][rows])
    pool.take(20, 2, [10, 20], other)  # a restarted learner's pool
    assert pool.versions == [10, 20]
    pool.take(0, 1, [0], seed)
    assert pool.versions == [10, 20], "an earlier learner's snapshot is ignored"
    with pytest.raises(ValueError):
        pool.take(30, 2, [10, 20, 30], {"params/w": np.zeros(2, np.float32)})


def test_malformed_snapshots_are_counted_and_dropped():
    config = load_config(RPS, [])
    runner = make_runner(config, policy_spec(config, "opponent"), 0, 8, 8)
    pool, rejects = PoolRunner(runner), RejectCounter()
    context = zmq.Context()
    publisher, socket = context.socket(zmq.PUB), context.socket(zmq.SUB)
    try:
        publisher.bind("inproc://pool")
        socket.connect("inproc://pool")
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.2)  # the subscription reaches the publisher
        good = params_to_arrays(runner.params)
        for meta, arrays in (({"version": "7", "started_ms": 1, "pool": [7]}, good),
                             ({"version": 7, "started_ms": 1, "pool": "7"}, good),
                             ({"version": 7, "started_ms": 1, "pool": [0, 3]}, good),
                             ({"version": 7, "started_ms": 1, "pool": [7]},
                              {"params/w": np.zeros(2, np.float32)}),
                             ({"version": 7, "started_ms": 1, "pool": [0, 7]}, good)):
            send(publisher, "snapshot", meta, arrays)
        subscriber = PoolSubscriber(socket, pool, rejects)
        wait_for(lambda: subscriber.poll() or pool.updates, 5, "the good snapshot")
        assert rejects.count == 4 and pool.versions == [7]
    finally:
        publisher.close(linger=0)
        socket.close(linger=0)
        context.term()


def test_a_frozen_policy_has_inference_servers_but_no_learner():
    config = load_config(RPS, [])
    assert run_policies(config) == ["main"] and acting_policies(config) == ["main", "opponent"]
    assert [(kind, policy) for kind, _, policy in worker_plan(config)] == [
        ("learner", "main"), ("inference", "main"), ("inference", "opponent"),
        ("actor", "default"), ("actor", "default")]


@pytest.mark.parametrize("overrides, message", [
    (["selfplay.frozen=[nobody]"], "'selfplay.frozen': unknown policy 'nobody' (policies: "
                                   "main, opponent)"),
    (["selfplay.frozen=[main, opponent]"], "every policy is frozen; at least one must train"),
    (["selfplay.frozen=[opponent, opponent]"], "'selfplay.frozen' lists a policy twice"),
    (["selfplay.opponents={main: opponent}"], "'selfplay.opponents': 'main' is not a frozen "
                                              "policy"),
    (["selfplay.opponents={opponent: ghost}"], "'selfplay.opponents.opponent': 'ghost' is no "
                                               "trained policy"),
    (["selfplay.pool=0"], "'selfplay.pool' must be at least 1"),
    (["selfplay.snapshot_every=0"], "'selfplay.snapshot_every' must be at least 1"),
    (["env.policies={main: ['player_*'], opponent: [player_1]}"],
     "'env.policies': policy 'opponent' gets no agent"),
    (["evaluation.every_updates=5"], "the evaluator does not play frozen policies"),
    (["env.id=CartPole-v1", "env.policies={}"], "'selfplay' needs a multi-agent env"),
    (["env.policies={main: [player_0], pool: [player_1]}", "selfplay.frozen=[pool]",
      "selfplay.opponents={pool: main}"], "not be best or evaluated or pool"),
])
def test_selfplay_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        check_before_launch(load_config(RPS, overrides))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_self_play_trains_one_policy_against_snapshots_of_itself(processes, tmp_path):
    """One short real run: the frozen policy acts only, with exact copies of the trained
    policy's snapshots, and its episodes play several of them."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", "rps_selfplay", "--run-dir", str(run_dir),
            "--quiet"]
    for override in ("actors.count=1", "actors.envs=8", "learner.batch_envs=8",
                     "inference.max_batch=16", "learner.ppo.epochs=1",
                     "selfplay.snapshot_every=3", "selfplay.pool=50",
                     "checkpoint.every_updates=3", "checkpoint.keep=50",
                     "checkpoint.interval_s=0", "stop.wall_time_s=300"):
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    maxima = lambda rows: {r["policy/opponent/opponent_version_max"] for r in rows  # noqa: E731
                           if "policy/opponent/opponent_version_max" in r}
    rows = stop_when(process, run_dir, lambda row: row.get("policy/main/policy_version", 0)
                     >= 15 and len(maxima([row])) and row["policy/opponent/opponent_version_max"]
                     >= 9, 120, tmp_path / "launch.log")

    workers = [w["name"] for w in read_status(run_dir)["workers"]]
    assert workers == ["learner-main-0", "inference-main-0", "inference-opponent-0", "actor-0"]
    assert rows[-1]["system/wire_rejected"] == 0
    assert not any("policy/opponent/policy_version" in r for r in rows), "no learner"
    assert not checkpoint_steps(run_dir, policy="opponent")
    versions = [r["policy/main/policy_version"] for r in rows if "policy/main/policy_version" in r]
    assert versions == sorted(versions) and versions[-1] >= 15, "the trained policy advances"

    played = sorted(maxima(rows) | {r["policy/opponent/opponent_version_min"] for r in rows
                                    if "policy/opponent/opponent_version_min" in r})
    assert len(played) >= 3 and played[0] == 0, played
    assert all(v % 3 == 0 for v in played), "only snapshots are played"
    assert any("policy/opponent/episode_return_mean" in r for r in rows)

    pool = SnapshotPool(every=3, size=50, directory=pool_root(run_dir, "main"))
    pool.load(up_to=10 ** 9)
    assert pool.versions[:4] == [0, 3, 6, 9]
    config = load_config(RPS, [])
    seed = params_to_arrays(make_runner(config, policy_spec(config, "opponent"), 0, 8, 8).params)
    # The learner initialises under its own jit: its orthogonal matrices differ in the
    # last bits (up to about 1e-6) from those a server builds.
    for name, array in seed.items():
        np.testing.assert_allclose(pool.snapshots[0][name], array, rtol=0, atol=1e-5,
                                   err_msg="version 0 is the seed's, as the servers build it")
    saved = set(checkpoint_steps(run_dir, policy="main")) & set(pool.versions) - {0}
    assert len(saved) >= 3
    for step in sorted(saved):
        params = params_to_arrays(load_policy(run_dir, step=step, policy="main").params)
        for name, array in params.items():
            np.testing.assert_array_equal(pool.snapshots[step][name], array,
                                          err_msg=f"snapshot {step} is the trained policy's")
