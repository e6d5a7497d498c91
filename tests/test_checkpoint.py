"""Checkpoints on disk: exact round trips, retention, torn saves, and the run-directory
helpers a resume relies on."""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import tracemalloc
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import yaml

from learners.algorithms.train_state import TrainState
from learners.training.checkpoint import (
    Checkpointer,
    _to_saveable,
    read_step,
    restore_params,
    save_params,
)
from srl_jax.config.checkpoint_location import (
    FORMAT,
    FORMAT_KEY,
    FORMATS,
    CheckpointFormatError,
    location_problem,
    s3_kvstore,
)
from srl_jax.config.checks import check_checkpoint_hosts
from srl_jax.config.loader import SHIPPED_CONFIGS, config_from_dict, config_to_dict, load_config
from srl_jax.config.schema import ConfigError
from srl_jax.evaluate import main as evaluate_main
from srl_jax.launch import main as launch_main
from srl_jax.launch import parse_args, prepare_run
from srl_jax.runtime.run_dir import (
    DISCARDED_METRICS,
    checkpoint_meta,
    checkpoint_root,
    checkpoint_steps,
    evaluated_root,
    latest_resumable_run,
    newest_steps,
    read_metrics,
    step_meta,
    trim_metrics,
)
from tests.conftest import make_config
from tests.test_config import assert_one_config_error_line
from tests.update_checks import small_policy_state

EXPERIMENT = SHIPPED_CONFIGS / "cartpole_ppo.yaml"


def trained_state(shift: float = 0.0) -> TrainState:
    """A train state with non-trivial optimizer moments, obs statistics and RNG key."""
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-3))
    _, state = small_policy_state(optimizer)
    params = state.params
    grads = jax.tree.map(lambda x: np.full(x.shape, 0.1 + shift, x.dtype), params["net"])
    updates, opt_state = optimizer.update(grads, state.opt_state, params["net"])
    params = {**params, "net": optax.apply_updates(params["net"], updates),
              "obs_mean": params["obs_mean"] + 1.5 + shift, "obs_count": params["obs_count"] + 7}
    key = jax.random.split(state.key)[int(shift > 0)]
    return state._replace(params=params, opt_state=opt_state, key=key, version=jnp.int32(3))


def assert_same_tree(a: object, b: object) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.random.key_impl(x) == jax.random.key_impl(y)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).dtype == np.asarray(y).dtype


def test_round_trip_is_exact_and_keeps_types(tmp_path: Path) -> None:
    state = trained_state()
    meta = {"version": 3, "processes": [{"frames_consumed": 123}], "config": {"seed": 0}}
    checkpointer = Checkpointer(tmp_path, keep=2)
    assert checkpointer.save(3, state, meta) >= 0
    checkpointer.close()
    like = trained_state(shift=1.0)  # same shapes, other values
    restored = Checkpointer(tmp_path).restore(like)
    assert restored.step == 3 and restored.meta == meta  # the format stays in the step
    assert_same_tree(restored.state, state)
    assert isinstance(restored.state, TrainState)
    assert isinstance(restored.state.opt_state, tuple)  # not a list, as a bare restore gives
    assert type(restored.state.opt_state[1][0]) is type(state.opt_state[1][0])
    assert checkpoint_meta(tmp_path, 3) == {**meta, FORMAT_KEY: FORMAT}


def test_keeps_the_newest_and_the_best(tmp_path: Path) -> None:
    state = trained_state()
    checkpointer = Checkpointer(tmp_path, keep=2)
    for step, score in [(1, 10.0), (2, 30.0), (3, 20.0), (4, None), (5, 25.0)]:
        meta = {"version": step} | ({"episode_return_mean": score} if score is not None else {})
        checkpointer.save(step, state._replace(version=jnp.int32(step)), meta)
    assert checkpointer.save(5, state, {"version": 5}) == 0.0  # already saved: nothing to do
    checkpointer.close()
    assert checkpoint_steps(tmp_path) == [4, 5]
    assert checkpoint_steps(tmp_path, best=True) == [2]
    reopened = Checkpointer(tmp_path, keep=2)
    assert reopened.best_return == 30.0
    assert int(reopened.restore(state, best=True).state.version) == 2
    reopened.close()


def test_a_donor_is_copied_as_of_the_version_that_earned_its_rank(tmp_path: Path) -> None:
    """PBT: a member ranked on what version 25 scored copies its step 20 (the newest at or
    before 25), not the newer 30 nobody ranked; with nothing that old, nothing."""
    state = trained_state()
    donor = Checkpointer(tmp_path, keep=5, policy="m1")
    for step in (10, 20, 30):
        donor.save(step, state._replace(version=jnp.int32(step)), {"version": step})
    donor.close()
    member = Checkpointer(tmp_path, policy="m0")
    assert member.restore_from("m1", state, at_most=25).step == 20
    assert member.restore_from("m1", state, at_most=30).step == 30
    assert member.restore_from("m1", state, at_most=9) is None
    assert member.restore_from("m1", state).step == 30
    member.close()


def test_a_torn_save_is_never_loaded_and_is_cleaned_up(tmp_path: Path) -> None:
    state = trained_state()
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(3, state, {"version": 3})
    checkpointer.close()
    torn = tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp"
    (torn / "state").mkdir(parents=True)
    (torn / "state" / "partial").write_bytes(b"\0" * 100)
    assert checkpoint_steps(tmp_path) == [3]
    reopened = Checkpointer(tmp_path)
    assert reopened.latest_step() == 3
    assert reopened.restore(state).step == 3
    assert not torn.exists()
    reopened.close()


def test_saves_leave_no_python_memory_behind(tmp_path: Path) -> None:
    """The learner saves every few seconds for days: after warm-up, saves keep nothing.

    Through orbax's jax.Array handler and OCDBT, tensorstore's JSON conversion
    leaked about 30 KB of this state's saves each. What the newest save still
    holds (its futures, threads' leftovers) is a constant, under 100 KB."""
    state = trained_state()
    checkpointer = Checkpointer(tmp_path, keep=2)

    def save(steps: range) -> int:
        """Python heap in use after saving `steps`."""
        for step in steps:
            checkpointer.save(step, state._replace(version=jnp.int32(step)),
                              {"version": step, "episode_return_mean": float(step % 5)})
        checkpointer.wait()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    saves = 30
    tracemalloc.start()
    try:
        warm = save(range(1, 6))
        kept = save(range(6, 6 + saves)) - warm
    finally:
        tracemalloc.stop()
        checkpointer.close()
    assert kept / saves < 10_000, f"{kept / saves:.0f} bytes of Python heap kept per save"
    assert checkpoint_steps(tmp_path) == [4 + saves, 5 + saves]


class PrePopulationState(NamedTuple):
    """The train state before populations gave it live hyperparameters (`hyper`)."""

    params: Any
    opt_state: Any
    key: jax.Array
    version: jax.Array
    extra: Any = ()


def live_state() -> TrainState:
    """A train state of today's format: with a live hyperparameter."""
    return trained_state()._replace(hyper={"learning_rate": jnp.float32(1e-3)})


def write_pre_format_checkpoint(run_dir: Path, step: int, config: dict[str, Any]) -> Path:
    """A step as srl_jax wrote it before checkpoints recorded their format, written with
    orbax as it was then: its defaults (OCDBT), the pre-population state, a meta with no
    format. Returns the checkpoint location."""
    root = (run_dir / "checkpoints").resolve()
    state = PrePopulationState(*trained_state()[:5])
    meta = {"version": step, "saved_at": 0.0, "processes": [{}], "config": config}
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(create=True)) as old:
        old.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_to_saveable(state)),
                                               meta=ocp.args.JsonSave(meta)))
    assert (root / str(step) / "state" / "manifest.ocdbt").exists()
    return root


def format_line(root: Path, step: int, found: object, written: str) -> str:
    return (f"checkpoint step {step} in {root} is in checkpoint format {found!r} ({written}), "
            f"but this srl_jax writes and restores format {FORMAT} only: start a fresh run (a "
            "new run directory and checkpoint.dir), or use the srl_jax that wrote it")


PRE_FORMAT = "written before checkpoints recorded their format"


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path: Path) -> None:
    """What srl_jax wrote before this format (and before populations) does not fit today's
    state: the restore names both formats instead of failing in orbax's tree comparison;
    so does a step of a newer srl_jax, and every reader of a step's meta."""
    root = write_pre_format_checkpoint(tmp_path, 7, {})
    checkpointer = Checkpointer(tmp_path)
    with pytest.raises(CheckpointFormatError) as refused:
        checkpointer.restore(live_state())
    checkpointer.close()
    assert str(refused.value) == format_line(root, 7, 1, PRE_FORMAT)
    assert isinstance(refused.value, ConfigError), "a worker refuses the run with it"
    with pytest.raises(CheckpointFormatError, match="checkpoint format 1 "):
        checkpoint_meta(tmp_path, 7)

    run_dir = tmp_path / "newer"
    saver = Checkpointer(run_dir)
    saver.save(8, live_state(), {"version": 8})
    saver.close()
    assert checkpoint_meta(run_dir, 8)[FORMAT_KEY] == FORMAT, "every save records it"
    root = checkpoint_root(run_dir)
    meta_file = root / "8" / "meta" / "metadata"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()),
                                     FORMAT_KEY: FORMAT + 1}))
    with pytest.raises(CheckpointFormatError) as newer:
        Checkpointer(run_dir).restore(live_state())
    assert str(newer.value) == format_line(root, 8, FORMAT + 1, "written by a newer srl_jax")
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), FORMAT_KEY: 2}))
    with pytest.raises(CheckpointFormatError) as older:  # MuZero's state before its target net
        Checkpointer(run_dir).restore(live_state())
    assert str(older.value) == format_line(root, 8, 2, FORMATS[2])

    evaluated = evaluated_root(tmp_path)
    save_params(evaluated, 2, live_state().params, {"version": 2})
    assert step_meta(evaluated, 2)[FORMAT_KEY] == FORMAT
    meta_file = evaluated / "2" / "meta" / "metadata"
    meta_file.write_text(json.dumps({"version": 2}))
    with pytest.raises(CheckpointFormatError, match="checkpoint format 1 "):
        restore_params(evaluated, 2, live_state().params)


def test_resume_and_evaluate_refuse_an_old_checkpoint_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`launch --resume` before any worker starts, and `srl_jax.evaluate`: exit code 2 and
    the one line. (A learner that finds one refuses the run: tests/test_resume.py.)"""
    config = config_to_dict(load_config(EXPERIMENT))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    root = write_pre_format_checkpoint(run_dir, 7, config)
    line = format_line(root, 7, 1, PRE_FORMAT)
    capsys.readouterr()
    assert launch_main(["cartpole_ppo", "--resume", "--run-dir", str(run_dir), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"srl_jax.launch: config error: {line}"]
    assert not (run_dir / "logs").exists(), "no worker started"
    assert evaluate_main([str(run_dir), "--episodes", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"srl_jax.evaluate: {line}"]


def test_restore_without_checkpoints_is_none(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    assert checkpointer.restore(trained_state()) is None
    checkpointer.close()


def write_rows(run_dir: Path, steps: list[int], torn: bool = False) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"time": float(i), "env_frames": 100 * i, "learner_steps": s})
             for i, s in enumerate(steps)]
    text = "\n".join(lines) + "\n" + ('{"time": 99, "env_fr' if torn else "")
    (run_dir / "metrics.jsonl").write_text(text)


def test_trim_metrics_keeps_rows_up_to_the_checkpoint(tmp_path: Path) -> None:
    write_rows(tmp_path, [0, 1, 2, 3, 4, 5], torn=True)
    last = trim_metrics(tmp_path, {"default": 3})
    assert last == {"time": 3.0, "env_frames": 300, "learner_steps": 3}
    assert [r["learner_steps"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    discarded = [json.loads(x) for x in (tmp_path / DISCARDED_METRICS).read_text().splitlines()]
    assert [r["learner_steps"] for r in discarded] == [4, 5]
    assert trim_metrics(tmp_path, {"default": 3}) == last  # idempotent


def test_trim_metrics_cuts_where_any_policy_went_past_its_checkpoint(tmp_path: Path) -> None:
    versions = [(0, 0), (2, 1), (4, 3), (5, 5), (7, 6)]  # (red, blue) per row
    rows = [{"time": float(i), "learner_steps": max(v), "policy/red/policy_version": v[0],
             "policy/blue/policy_version": v[1]} for i, v in enumerate(versions)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    last = trim_metrics(tmp_path, {"red": 5, "blue": 3})
    assert last["time"] == 2.0, "the row after is past blue's checkpoint step 3"
    assert len(read_metrics(tmp_path)) == 3


def write_config(run_dir: Path, **sections: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"name": "exp", **sections}))


def test_latest_resumable_run_skips_runs_without_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for name, step in [("20260101-000000", None), ("20260102-000000", 4),
                       ("20260103-000000", None)]:
        run = root / "exp" / name
        write_config(run)
        if step is not None:
            (run / "checkpoints" / str(step)).mkdir(parents=True)
            (run / "checkpoints" / f"{step + 1}.orbax-checkpoint-tmp").mkdir()
    assert latest_resumable_run(root, "exp") == root / "exp" / "20260102-000000"
    assert latest_resumable_run(root, "other") is None
    multi = root / "exp" / "20260104-000000"
    write_config(multi, env={"id": "pettingzoo:mpe2.simple_tag_v3",
                             "policies": {"red": ["a*"], "blue": ["b*"]}})
    (multi / "checkpoints" / "best" / "3").mkdir(parents=True)
    assert latest_resumable_run(root, "exp") == root / "exp" / "20260102-000000", \
        "a best link alone is no policy's checkpoint"
    (multi / "checkpoints" / "red" / "3").mkdir(parents=True)
    assert latest_resumable_run(root, "exp") == multi, "a policy's own checkpoint"
    elsewhere = root / "exp" / "20260105-000000"
    write_config(elsewhere, checkpoint={"dir": str(tmp_path / "not-on-this-host")})
    write_rows(elsewhere, [0, 1])
    assert latest_resumable_run(root, "exp") == multi, "no checkpoint recorded in its metrics"
    (elsewhere / "metrics.jsonl").write_text(json.dumps({"learner/checkpoint_step": 1}) + "\n")
    assert latest_resumable_run(root, "exp") == elsewhere, "its learner reported one"


def test_checkpoint_dir_is_a_local_path_or_a_known_uri() -> None:
    for good in ("", "/data/ckpt", "gs://bucket/run", "s3://bucket/run", "file:///data/ckpt",
                 "file://localhost/data/ckpt"):
        assert location_problem(good) is None, good
    for bad, why in [("ckpt", "must be an absolute path"), ("ftp://host/x", "unknown scheme"),
                     ("gs://", "names no bucket"), ("file://host/x", "no local file URI"),
                     ("file://x", "no local file URI")]:
        assert why in location_problem(bad), bad
    with pytest.raises(ConfigError, match=r"^'checkpoint.dir': unknown scheme 'hdfs://'"):
        load_config(EXPERIMENT, ["checkpoint.dir=hdfs://nn/run"])
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(ConfigError, match=r"^'checkpoint.dir': gs:// needs gcsfs on every "):
            prepare_run(parse_args(["cartpole_ppo", "--set", "checkpoint.dir=gs://b/run"]))


@pytest.mark.parametrize("store", [
    "file",
    # some 12 s on 2 cores: moto, in the test's own process, answers every request
    pytest.param("s3", marks=pytest.mark.slow)])
def test_checkpoints_go_to_a_location_outside_the_run_dir(
        store: str, tmp_path: Path, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    """Steps, the best copy, donors and the evaluator's parameters all under the location,
    a file:// URI or a bucket (on an S3 server on loopback); the run directory, and the
    working directory (where orbax alone put an s3:// step's arrays), hold none of them.
    Reading them (as `load_policy` and `srl_jax.evaluate` do) logs no warning."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "learner-host" / "ckpt"
    uri = f"{request.getfixturevalue('s3_bucket')}/ckpt" if store == "s3" else \
        f"file://{elsewhere}"
    root = checkpoint_root(run_dir, location=uri)
    assert os.fspath(root) == (uri if store == "s3" else os.fspath(elsewhere))
    assert checkpoint_root(run_dir, best=True, policy="red", location=uri) == \
        root / "red" / "best"
    state = trained_state()
    for policy in ("red", "blue"):
        checkpointer = Checkpointer(run_dir, keep=1, policy=policy, location=uri)
        for step, score in [(1, 5.0), (2, 1.0)]:
            checkpointer.save(step, state._replace(version=jnp.int32(step)),
                              {"version": step, "episode_return_mean": score})
        checkpointer.close()
        assert checkpoint_steps(run_dir, policy=policy, location=uri) == [2]
        assert checkpoint_steps(run_dir, best=True, policy=policy, location=uri) == [1]
    save_params(evaluated_root(run_dir, "red", uri), 2, state.params, {"version": 2})
    assert not run_dir.exists()
    torn = root / "red" / "3"
    if store == "s3":  # a step that a kill left without its commit file
        (torn / "meta" / "metadata").write_text("{}")
        assert read_step(run_dir, state, 2, policy="red", location=uri).step == 2
        assert torn.exists(), "a reader (srl_jax.evaluate) leaves it: it may be a save in flight"
    caplog.clear()
    reopened = Checkpointer(run_dir, policy="red", location=uri)
    assert not torn.exists(), "a bucket's torn step goes (and best/ stays)"
    assert reopened.best_return == 5.0
    assert int(reopened.restore(state, best=True).state.version) == 1
    assert reopened.restore_from("blue", state).step == 2, "a donor under the same location"
    reopened.close()
    assert restore_params(evaluated_root(run_dir, "red", uri), 2, state.params).step == 2
    assert read_step(run_dir, state, 2, policy="blue", location=uri).step == 2
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    config = config_from_dict({"name": "exp", "checkpoint": {"dir": uri}, "env": {
        "id": "pettingzoo:mpe2.simple_tag_v3", "policies": {"red": ["a*"], "blue": ["b*"]}}})
    assert newest_steps(run_dir, config) == {"red": 2, "blue": 2}
    assert not Path("s3:").exists()


def test_s3_arrays_go_to_the_store_the_aws_variables_name() -> None:
    """tensorstore's s3 driver reads neither variable itself; botocore's order decides."""
    environ = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "us-east-1"}
    assert s3_kvstore("s3://b/run/1/state/w", environ) == {
        "driver": "s3", "bucket": "b", "path": "run/1/state/w",
        "endpoint": "http://127.0.0.1:9", "aws_region": "us-east-1"}
    environ |= {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:8", "AWS_REGION": "eu-west-1"}
    assert s3_kvstore("s3://b/run", environ) == {
        "driver": "s3", "bucket": "b", "path": "run", "endpoint": "http://127.0.0.1:8",
        "aws_region": "eu-west-1"}
    assert s3_kvstore("s3://b/run", {}) == {"driver": "s3", "bucket": "b", "path": "run"}, \
        "AWS's own S3, the bucket's region found by tensorstore"


def test_newest_steps_come_from_the_metrics_when_the_location_is_elsewhere(
        tmp_path: Path) -> None:
    """A learner's own directory that this host does not see: the step its learners last
    reported stands in for a look."""
    rows = [{"learner_steps": 3}, {"learner_steps": 5, "policy/red/checkpoint_step": 4},
            {"learner_steps": 6, "policy/blue/checkpoint_step": 2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = config_from_dict({"name": "exp", "checkpoint": {"dir": "/not/on/this/host"},
                               "env": {"id": "pettingzoo:mpe2.simple_tag_v3",
                                       "policies": {"red": ["a*"], "blue": ["b*"]}}})
    assert newest_steps(tmp_path, config) == {"red": 4, "blue": 2}


def test_a_resume_needs_no_view_of_the_learners_directory(tmp_path: Path) -> None:
    """The launcher resumes a run whose learner checkpointed to its host's own directory
    from the step the metrics record, and cuts the rows after it; a new run refuses a
    location that already holds checkpoints."""
    learner_dir = tmp_path / "learner-host"
    config = load_config(EXPERIMENT, [f"checkpoint.dir={learner_dir}"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    rows = [{"time": float(i), "env_frames": 100 * i, "learner_steps": i,
             **({"learner/checkpoint_step": i - i % 2} if i else {})} for i in range(6)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = parse_args(["cartpole_ppo", "--resume", "--run-dir", str(run_dir)])
    _, _, steps, _ = prepare_run(args)
    assert steps == {"default": 4}
    assert trim_metrics(run_dir, steps)["learner_steps"] == 4
    (learner_dir / "7" / "meta").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"'--resume': checkpoint step 7 in .* no readable meta"):
        prepare_run(args)
    (learner_dir / "7" / "meta" / "metadata").write_text(json.dumps({FORMAT_KEY: FORMAT}))
    assert prepare_run(args)[2] == {"default": 7}, "seen here: the directory itself counts"
    with pytest.raises(ConfigError, match=r"'checkpoint.dir': .* already holds checkpoints"):
        prepare_run(parse_args(["cartpole_ppo", "--run-dir", str(tmp_path / "new"), "--set",
                                f"checkpoint.dir=file://{learner_dir}"]))


def test_damaged_metrics_are_a_resume_error_not_a_silent_cut(tmp_path: Path) -> None:
    write_rows(tmp_path, [0, 1, 2])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:10]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"'--resume': .*metrics.jsonl:2: not a JSON object"):
        trim_metrics(tmp_path, {"default": 2})


CLUSTER = ("ray", "10.0.0.1:6379")
"""A Ray cluster given by address: the learners may land on different hosts."""


@pytest.mark.parametrize("overrides, backend, address, refused", [
    ([], *CLUSTER, "'' (the run directory)"),
    (["checkpoint.dir=/data/ckpt"], *CLUSTER, "'/data/ckpt'"),
    (["checkpoint.dir=file:///data/ckpt"], *CLUSTER, "'file:///data/ckpt'"),
    (["ray.address=10.0.0.1:6379"], "ray", "", "'' (the run directory)"),
    (["checkpoint.dir=gs://b/run"], *CLUSTER, None),
    (["checkpoint.dir=s3://b/run"], *CLUSTER, None),
    (["checkpoint.dir=/data/ckpt", "checkpoint.shared=true"], *CLUSTER, None),
    (["checkpoint.shared=true"], *CLUSTER, None),
    (["checkpoint.enabled=false"], *CLUSTER, None),
    ([], "ray", "", None),  # a local Ray instance: this host alone
    ([], "local", "", None),
    (["learner.processes=1"], *CLUSTER, None),
])
def test_learners_on_several_hosts_checkpoint_where_they_all_see_it(
        overrides: list[str], backend: str, address: str, refused: str | None) -> None:
    """Orbax writes each step from the first learner process alone, and every process
    restores the newest after a restart: a host's own disk serves one host only."""
    config = make_config(["learner.processes=2", "actors.splits=4", *overrides])
    if refused is None:
        check_checkpoint_hosts(config, backend, address)
        return
    with pytest.raises(ConfigError) as error:
        check_checkpoint_hosts(config, backend, address)
    assert str(error.value) == (
        f"'checkpoint.dir' {refused} is on one host's disk, but 'learner.processes' 2 may run "
        "on several hosts of the Ray cluster, and only one host's disk would hold the "
        "checkpoints they all restore: give a bucket (gs://... or s3://...), or set "
        "'checkpoint.shared: true' if every learner host mounts it at the same path")


@pytest.mark.parametrize("overrides, refused", [
    ([], True), (["checkpoint.shared=true"], False), (["checkpoint.dir=s3://b/run"], False),
    (["population.exploit=false"], False)])
def test_a_population_on_several_hosts_copies_from_where_every_learner_sees(
        overrides: list[str], refused: bool) -> None:
    """A loser loads its donor's checkpoint: on another host's disk it would find none,
    and PBT would never exploit. A sweep (no exploit) copies nothing."""
    config = load_config(SHIPPED_CONFIGS / "cartpole_ppo_pbt.yaml", overrides)
    if not refused:
        check_checkpoint_hosts(config, *CLUSTER)
        return
    with pytest.raises(ConfigError, match=r"^'checkpoint.dir' '' \(the run directory\) is on "
                       r"one host's disk, but the learners of 'population.members' 4 may run "
                       r"on several hosts .* the donors' checkpoints the losers copy: give a "
                       r"bucket"):
        check_checkpoint_hosts(config, *CLUSTER)


def test_the_launcher_refuses_learners_on_several_hosts_a_host_local_location(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Exit 2 and the one line, before anything starts (the coordinator's opt-in given)."""
    code = launch_main(["cartpole_ppo", "--backend", CLUSTER[0], "--ray-address", CLUSTER[1],
                        "--run-dir", str(tmp_path / "run"), "--set", "learner.processes=2",
                        "--set", "actors.splits=4", "--set",
                        "transport.allow_unauthenticated=true"])
    stdout, stderr = capsys.readouterr()
    assert_one_config_error_line(code, stdout, stderr, "'checkpoint.dir' '' (the run "
                                 "directory) is on one host's disk, but 'learner.processes' 2")
    assert not (tmp_path / "run").exists(), "nothing may start before validation passes"
