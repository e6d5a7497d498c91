"""Checkpoints end to end: stop and resume, a killed learner, checkpoints outside the run
directory (the evaluator and `srl_jax.evaluate --best` on a trained run are in
tests/test_recurrent_run.py).

Real launcher, controller, workers and orbax checkpoints on loopback.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import s3fs
import yaml
import zmq

from actors.actor_worker import split_seeds
from learners.models.param_codec import params_to_arrays
from policy.export import load_policy
from srl_jax.config.checkpoint_location import COMMIT_FILE, FORMAT, FORMAT_KEY, steps_in
from srl_jax.dataflow.metrics_table import (
    COMMON,
    CONTRACT_KEYS,
    OTHER_ROWS,
    POLICY,
    SHOWN_ALWAYS,
    Row,
    Shown,
)
from srl_jax.dataflow.stream_table import PARAMS, STATS
from srl_jax.dataflow.worker_kinds import EXIT_REFUSED, metrics_reference_markdown, worker_kind
from srl_jax.evaluate import main as evaluate_main
from srl_jax.runtime.incarnation import FIRST, Incarnation
from srl_jax.runtime.metrics import tensorboard_tag
from srl_jax.runtime.run_dir import (
    checkpoint_root,
    checkpoint_steps,
    read_run_config,
)
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import LOOPBACK, RejectCounter, make_socket, receive
from tests.conftest import (
    REPO,
    Processes,
    all_running,
    launch,
    logged_env_seeds,
    pid_alive,
    read_events,
    read_metrics,
    read_status,
    wait_for,
    wait_restarted,
    worker,
)
from tests.paced_env import SMALL_PACED_RUN

pytestmark = pytest.mark.slow

N = 30_000
UPDATES = 3
"""Frames before the stop; the first resume goes N past the frames at the stop (more than
the stream buffers, so it trains on), the second, which need not train, N // 3 further."""
LEAN = ("actors.count=1", "learner.sample_queue=4")
"""One actor, and a learner that holds 4 chunks: the actor blocks sooner while the learner
starts (or restarts) rather than step ahead on both cores, and frames past what the stream
buffers (fewer than N) come with updates."""


def launch_args(run_dir: Path, *overrides: str, resume: bool = False) -> list[str]:
    args = [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir", str(run_dir),
            "--quiet", *(["--resume"] if resume else [])]
    for override in overrides:
        args += ["--set", override]
    return args


def assert_continuous(rows: list[dict]) -> None:
    """No counter goes back and no row repeats."""
    for a, b in itertools.pairwise(rows):
        assert a["time"] < b["time"], (a, b)
        assert a["env_frames"] <= b["env_frames"], (a, b)
        assert a["learner_steps"] <= b["learner_steps"], (a, b)


def learner_checkpoints(run_dir: Path) -> Path:
    """Where `stopped_run`'s learner checkpoints: a directory of its own, outside the run
    directory (as a learner host's own disk would be)."""
    return run_dir.parent / "learner-host" / "checkpoints"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A CartPole run (`LEAN`) stopped with SIGTERM after N frames and a few updates (the
    actor steps before the learner has compiled: frames alone can come first). Its frame limit is
    far, so it cannot end on its own before the signal however fast the machine steps.
    Its checkpoints go to `learner_checkpoints`, given as an absolute path."""
    group = Processes()
    tmp = tmp_path_factory.mktemp("stopped")
    run_dir = tmp / "run"
    process = group.start(launch_args(run_dir, "stop.target_return=null", *LEAN,
                                      f"stop.env_frames={1000 * N}", "checkpoint.interval_s=3",
                                      f"checkpoint.dir={learner_checkpoints(run_dir)}"),
                          log=tmp / "launch.log")
    wait_for(lambda: (rows := read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists()
                      else []) and rows[-1]["env_frames"] >= N
             and rows[-1]["learner_steps"] >= UPDATES, 120, f"{N} env frames, {UPDATES} updates")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=90) == 130, (tmp / "launch.log").read_text()
    yield run_dir
    group.stop_all()


ALGORITHM_KEYS = ("learner/loss", "learner/pg_loss", "learner/value_loss", "learner/entropy",
                  "learner/approx_kl", "learner/clip_frac", "learner/epochs_run",
                  "learner/advantage_mean", "learner/return_mean")
"""PPO's training diagnostics (its `train/` counters): the algorithm's own, not the table's."""


def declared_rows() -> list[Row]:
    """The rows the metrics table declares for a default run's kinds and for every
    worker, but those a default run on a CPU has no reason to make (device memory,
    replay timeouts, each policy's, the algorithm's)."""
    counters = [c for kind in SHOWN_ALWAYS for c in worker_kind(kind).counters] + list(COMMON)
    return [row for counter in counters if not counter.family for row in counter.rows
            if not row.optional and POLICY not in row.key]


CONTROLLER_KEYS = tuple(row.key for row in OTHER_ROWS if row.source == "controller")
DOCUMENTED_KEYS = tuple(dict.fromkeys((*CONTRACT_KEYS, *CONTROLLER_KEYS,
                                       *(row.key for row in declared_rows()), *ALGORITHM_KEYS)))
"""The metrics keys of the default experiment (PPO, remote inference), as the metrics
table and the docs generated from it list them."""
ALWAYS = (*CONTROLLER_KEYS, *(row.key for row in declared_rows()
                              if row.shown not in (Shown.RATIO, Shown.SPARE, Shown.STEP)))
"""The keys every row has: all but the ratios (absent over a window with nothing to
divide by) and the checkpoint step (absent until the first checkpoint)."""


def test_a_default_run_keeps_its_documented_contracts(stopped_run: Path) -> None:
    """Metrics keys, TensorBoard events and loopback-only binds, on a real default run."""
    page = (REPO / "docs" / "metrics.md").read_text() + metrics_reference_markdown()
    undocumented = [key for key in DOCUMENTED_KEYS if f"`{key}`" not in page
                    and f"`{key.removeprefix('learner/')}`" not in page]
    assert not undocumented, "the docs (docs/metrics.md, the generated reference) name them"
    rows = read_metrics(stopped_run)
    assert all(key in row for row in rows for key in ALWAYS)
    missing = [key for key in DOCUMENTED_KEYS if not any(key in row for row in rows)]
    assert not missing, f"documented keys no row carries: {missing}"
    controller_log = (stopped_run / "logs" / "controller.log").read_text()
    assert "does not declare" not in controller_log, "a counter missing from the metrics table"

    tags = {(value.tag, event.step) for event in read_events(stopped_run)
            for value in event.summary.value}
    last = rows[-1]
    absent = [key for key, value in last.items() if isinstance(value, int | float)
              and key != "time" and (tensorboard_tag(key), last["env_frames"]) not in tags]
    assert not absent, f"keys of the last row missing from TensorBoard: {absent}"

    status = read_status(stopped_run)
    ports = status["ports"] + [port for w in status["workers"] for port in w["ports"]]
    assert {w["kind"] for w in status["workers"] if w["ports"]} >= {"learner", "inference"}
    for port in ports:
        for address in (port["bind"], port["endpoint"].removeprefix("tcp://")):
            host = address.rsplit(":", 1)[0]
            assert ipaddress.ip_address(host).is_loopback, port


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "names")  # so any endpoint that appears is the resumed run's
    return copy


def first_params(run_dir: Path) -> dict:
    """The first parameter message the resumed learner publishes (subscribed before it
    publishes: the endpoint is registered before the learner restores and compiles)."""
    endpoint = FileNameService(run_dir / "names").lookup(PARAMS.key(), timeout_s=120)
    socket = make_socket(zmq.Context.instance(), PARAMS.connect_type)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    try:
        assert socket.poll(120_000), "no parameters published"
        received = receive(socket, PARAMS.connecter_receives, RejectCounter())
        assert received is not None
        return {"meta": received[1].meta,
                "arrays": {k: np.array(v) for k, v in received[1].arrays.items()}}
    finally:
        socket.close(linger=0)


BUCKET_SAVES = ("checkpoint.interval_s=0", "checkpoint.keep_best=false")
"""The resumes save to the bucket when they stop, and only then: each save is a hundred
requests to a server in the test's process (a bucket's best copy is test_checkpoint.py's)."""


def upload_steps(local: Path, uri: str) -> None:
    """`local`'s complete steps, its best one included, into the bucket at `uri`, each
    with orbax's commit file last, as a learner writes a bucket's steps (a local step's
    rename is its commit)."""
    bucket = s3fs.S3FileSystem()
    for folder in (local, local / "best"):
        for step in steps_in(folder):
            source = folder / str(step)
            target = f"{uri}/{source.relative_to(local)}"
            bucket.put(f"{source}/", target, recursive=True)
            bucket.pipe(f"{target}/{COMMIT_FILE}", b"")


def test_sigterm_writes_a_final_checkpoint_and_resumes_continue(
        stopped_run: Path, processes: Processes, tmp_path: Path,
        capsys: pytest.CaptureFixture, s3_bucket: str) -> None:
    """Resumed to a new frame limit, then resumed again with more actors (3, from 1). The
    checkpoints never touch the run directory: the learner's own directory moves into an
    s3:// bucket (an S3 server on loopback), `srl_jax.evaluate` and the first resume read it
    there, the first resume checkpoints there, and the second resumes from what it wrote."""
    run_dir = copy_run(stopped_run, tmp_path)
    assert not (run_dir / "checkpoints").exists()
    uri = f"{s3_bucket}/moved/checkpoints"
    upload_steps(learner_checkpoints(stopped_run), uri)
    before = read_metrics(run_dir)
    last = before[-1]
    step = checkpoint_steps(run_dir, location=uri)[-1]
    assert last["env_frames"] >= N
    assert step == last["learner_steps"] == last["policy_version"] == \
        last["learner/checkpoint_step"] > 0, "the final checkpoint holds the last update"
    assert read_status(run_dir)["state"] == "interrupted"
    saved = params_to_arrays(load_policy(run_dir, step=step, checkpoint_dir=uri).params)
    assert evaluate_main([str(run_dir), "--checkpoint-dir", uri, "--episodes", "1"]) == 0
    assert f"checkpoint step {step} of {run_dir}" in capsys.readouterr().out

    goal = last["env_frames"] + N
    process = processes.start(launch_args(run_dir, f"stop.env_frames={goal}",
                                          f"checkpoint.dir={uri}", *BUCKET_SAVES, resume=True),
                              log=tmp_path / "resume.log")
    published = first_params(run_dir)
    assert published["meta"]["version"] == step
    assert published["arrays"].keys() == saved.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(published["arrays"][name], value, err_msg=name)
    assert process.wait(timeout=180) == 0, (tmp_path / "resume.log").read_text()

    rows = read_metrics(run_dir)
    assert rows[:len(before)] == before, "rows written before the stop stay as they were"
    assert_continuous(rows)
    resumed = rows[len(before):]
    assert resumed[0]["env_frames"] >= last["env_frames"]
    assert resumed[0]["learner_steps"] >= step
    assert max(r["learner_steps"] for r in resumed) > step
    assert rows[-1]["env_frames"] >= goal and rows[-1]["system/resumes"] == 1
    status = read_status(run_dir)
    assert status["state"] == "finished" and status["resumes"] == 1
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert f"restored checkpoint step {step} " in log
    assert f"resumes from checkpoint step {step}" in (tmp_path / "resume.log").read_text()
    # The resumed actor plays new episodes: its envs are seeded anew, reproducibly.
    seeds = logged_env_seeds(run_dir, 0)
    config, resumed_start = read_run_config(run_dir), Incarnation(1, 0)
    for start in (FIRST, resumed_start):
        assert seeds[start] == split_seeds(config, 0, start)
    assert set(itertools.chain(*seeds[FIRST])).isdisjoint(itertools.chain(*seeds[resumed_start]))
    written = checkpoint_steps(run_dir, location=uri)[-1]
    assert written == rows[-1]["learner_steps"] > step, "the resumed learner's final save"

    goal = rows[-1]["env_frames"] + N // 3
    process = processes.start(launch_args(run_dir, "actors.count=3",
                                          f"stop.env_frames={goal}", resume=True),
                              log=tmp_path / "resume-more-actors.log")
    assert process.wait(timeout=180) == 0, (tmp_path / "resume-more-actors.log").read_text()
    rows = read_metrics(run_dir)
    assert_continuous(rows)
    assert rows[-1]["env_frames"] >= goal and rows[-1]["system/resumes"] == 2
    status = read_status(run_dir)
    assert sorted(w["name"] for w in status["workers"] if w["kind"] == "actor") == \
        ["actor-0", "actor-1", "actor-2"]
    assert all(w["restarts"] == 0 for w in status["workers"])
    assert f"resumes from checkpoint step {written}" in \
        (tmp_path / "resume-more-actors.log").read_text()
    assert f"restored checkpoint step {written} " in \
        (run_dir / "logs" / "learner-0.log").read_text()
    assert checkpoint_steps(run_dir, location=uri)[-1] == rows[-1]["learner_steps"]
    assert not (run_dir / "checkpoints").exists(), "nothing checkpointed into the run directory"
    assert not Path("s3:").exists(), "no array of the bucket's steps written locally"


def torn_saves(run_dir: Path) -> list[Path]:
    return sorted(checkpoint_root(run_dir).glob("*.orbax-checkpoint-tmp*"))


def test_a_killed_learner_recovers_from_the_newest_complete_checkpoint(
        processes: Processes, tmp_path: Path) -> None:
    """Killed twice: at any moment, then while a save is only a temporary directory. No
    frame limit: the actors could reach one while a successor compiles. The run goes on
    until each successor has trained, then stops on Ctrl-C with a final save."""
    process, run_dir = launch(processes, tmp_path, "stop.target_return=null",
                              "stop.wall_time_s=600", "runtime.restart_backoff_s=0.2",
                              "runtime.max_restarts=5", "checkpoint.every_updates=1",
                              "checkpoint.interval_s=0", *SMALL_PACED_RUN)
    wait_for(lambda: all_running(run_dir) and len(checkpoint_steps(run_dir)) >= 2, 120,
             "a running learner with checkpoints")
    log = run_dir / "logs" / "learner-0.log"
    for restarts, during_save in ((1, False), (2, True)):
        victim = worker(read_status(run_dir), "learner-0")["pid"]
        if during_save:  # a save every update: strike while one is being written
            wait_for(lambda: torn_saves(run_dir), 60, "a save in progress")
        Processes.kill(victim)
        wait_for(lambda v=victim: not pid_alive(v), 10, "the learner gone")
        complete = checkpoint_steps(run_dir)[-1]
        if during_save:
            torn = torn_saves(run_dir)
            assert torn and int(torn[0].name.split(".")[0]) > complete, \
                "the kill should leave a torn save newer than the newest complete one"
        restarted = wait_restarted(run_dir, "learner-0", victim, 120, restarts=restarts)
        wait_for(lambda c=complete: read_metrics(run_dir)[-1]["learner_steps"] > c + 5, 120,
                 "updates after the restored step")
        assert pid_alive(restarted["pid"])
        assert f"restored checkpoint step {complete} " in log.read_text()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=90) == 130, (tmp_path / "launch.log").read_text()
    assert not torn_saves(run_dir), "the restarted learner cleans up and its last save completes"
    rows = read_metrics(run_dir)
    assert checkpoint_steps(run_dir)[-1] == rows[-1]["learner_steps"], "a final save on Ctrl-C"
    assert rows[-1]["system/learner_restarts"] == 2
    assert all(a["env_frames"] <= b["env_frames"] for a, b in itertools.pairwise(rows))
    assert worker(read_status(run_dir), "learner-0")["restarts"] == 2


def test_evaluate_without_checkpoints_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "srl_jax.evaluate", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"srl_jax.evaluate: {tmp_path} holds no complete checkpoint (looked in "
        f"{tmp_path}/checkpoints)"]


def run_learner(run_dir: Path, incarnation: Incarnation) -> subprocess.CompletedProcess:
    """`python -m srl_jax.worker learner 0` on `run_dir` as the given start of the learner,
    with a stats stream to report to, until it exits."""
    context = zmq.Context.instance()
    stats = make_socket(context, STATS.bind_type)
    port = stats.bind_to_random_port(f"tcp://{LOOPBACK}")
    FileNameService(run_dir / "names").register(STATS.key(), f"tcp://{LOOPBACK}:{port}")
    env = {key: value for key, value in os.environ.items() if key not in FIRST.to_env()}
    try:
        return subprocess.run(
            [sys.executable, "-m", "srl_jax.worker", "learner", "0", "--run-dir", str(run_dir)],
            cwd=REPO, capture_output=True, text=True, timeout=180,
            env={**env, **incarnation.to_env()})
    finally:
        stats.close()


def test_a_new_runs_learner_refuses_another_runs_checkpoints(stopped_run: Path,
                                                             tmp_path: Path) -> None:
    """A learner whose `checkpoint.dir` already holds steps at a new run's first start
    (a directory the launcher could not look into) exits 2 naming it, rather than train
    on from another run; the controller ends the run on that code (test_refusal.py)."""
    config = yaml.safe_load((stopped_run / "config.yaml").read_text())
    run_dir = tmp_path / "new"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    refused = run_learner(run_dir, FIRST)
    assert refused.returncode == EXIT_REFUSED, refused.stderr[-2000:]
    assert "learner-0 refused the run: 'checkpoint.dir'" in refused.stderr
    assert "already holds checkpoints" in refused.stderr


def test_checkpoints_of_an_older_format_are_refused_in_one_line(
        stopped_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The run's real checkpoints, their format taken out of their meta as every srl_jax
    before formats wrote them: `--resume` exits 2 before any worker starts,
    `srl_jax.evaluate` exits 2, each with the one line; a learner that finds them (where
    the launcher cannot look) refuses the run with it rather than crash and restart."""
    run_dir = copy_run(stopped_run, tmp_path)
    location = tmp_path / "old-format"
    shutil.copytree(learner_checkpoints(stopped_run), location)
    for meta_file in location.glob("**/meta/metadata"):
        meta = json.loads(meta_file.read_text())
        meta.pop(FORMAT_KEY)
        meta_file.write_text(json.dumps(meta))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["checkpoint"]["dir"] = str(location)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    step = checkpoint_steps(run_dir, location=str(location))[-1]
    line = (f"checkpoint step {step} in {location} is in checkpoint format 1 (written before "
            f"checkpoints recorded their format), but this srl_jax writes and restores format "
            f"{FORMAT} only: start a fresh run (a new run directory and checkpoint.dir), or use "
            "the srl_jax that wrote it")

    resumed = subprocess.run(launch_args(run_dir, resume=True), cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 2, resumed.stderr[-2000:]
    assert resumed.stderr.splitlines() == [f"srl_jax.launch: config error: {line}"]
    assert not (run_dir / "names").exists(), "no worker started"
    assert evaluate_main([str(run_dir), "--episodes", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"srl_jax.evaluate: {line}"]

    refused = run_learner(run_dir, Incarnation(resumes=1))
    assert refused.returncode == EXIT_REFUSED, refused.stderr[-2000:]
    refusal = [text for text in refused.stderr.splitlines() if "refused the run" in text]
    assert len(refusal) == 1 and "learner-0 refused the run: checkpoint step " in refusal[0]
    assert refusal[0].endswith(line.split(" is in ", 1)[1]), "the step it read first: the best"
    assert "Traceback" not in refused.stderr
