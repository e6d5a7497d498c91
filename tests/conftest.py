"""Shared test helpers: run directories, real worker processes, stopping them by pid."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import pytest
import yaml
import zmq
from tensorboardX.proto import event_pb2

from srl_jax.config.loader import apply_overrides, config_from_dict, config_to_dict
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import resolve_algorithms
from srl_jax.dataflow.stream_table import STATS
from srl_jax.runtime.incarnation import Incarnation
from srl_jax.runtime.run_dir import read_metrics, read_status
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import make_socket
from srl_jax.wire.transport import Transport

REPO = Path(__file__).resolve().parent.parent
SEEDS_LOGGED = re.compile(r"resume (\d+), restart (\d+): env seeds by split (\[[\d\[\], ]+\])")


FAST_COMPILES = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
"""JAX settings for the suite's processes: tests compile many small programs and run each a
few times, so XLA's optimizer costs more than it saves. So do the runs tests start: most
spend their seconds starting and being killed, not training, and on a cold compilation
cache (a fresh machine's) the optimizer took a good part of a start (a cartpole_ppo start:
14 CPU-s with it against 10). Five of the longest files took 271 test-seconds against 314
with it; the runs trained to a target took as long either way."""


TEST_COMPILATION_CACHE = Path("~/.cache/srl_jax/jax_tests").expanduser()
"""The test processes' persistent compilation cache (least recently used entries go past
256 MiB), beside the runs' (`runtime.compilation_cache_dir`): the quick part took 89 s
with it warm against 201 s cold (2 cores, at 0806935). In the user's cache rather than
the clone's build/, so a fresh clone or a worktree of the same code starts warm; JAX's
keys hold the program, its options and JAX's version, so clones of other code share it
safely."""


def use_test_compilation_cache() -> None:
    """TEST_COMPILATION_CACHE for this process: the test process's, and the scripts tests
    run in fresh interpreters of their own (tests/mesh_check.py: 25 s cold, on 2 cores)."""
    jax.config.update("jax_compilation_cache_dir", str(TEST_COMPILATION_CACHE))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", 256 * 2**20)


def pytest_configure(config: pytest.Config) -> None:
    """FAST_COMPILES for the test process and every process it starts (by the environment);
    TEST_COMPILATION_CACHE for the test process (runs keep their own cache)."""
    os.environ.update(FAST_COMPILES)
    jax.config.update("jax_disable_most_optimizations", True)
    use_test_compilation_cache()


LONGEST_FILES = ("test_ray_backend.py", "test_population_run.py", "test_faults.py",
                 "test_resume.py", "test_documented_commands.py", "test_multi_agent.py",
                 "test_run.py", "test_recurrent_run.py", "test_atari.py", "test_distributed.py",
                 "test_multi_host.py", "test_masks.py", "test_replay_run.py", "test_soak.py")
"""The test files that take longest on 2 cores (`pytest -m slow --durations=40`), longest
first, so the long runs start early; but the Ray file, whose runs mostly wait (paced envs,
Ray's start, a node's), beside the population's, which loads both cores, and the soak
(paced too, 0.6 cores for a minute) last, beside the quick files. Re-measure when a file's
runs change much (CPU use sampled every 5 s showed both lanes waiting at once, 2 cores
idle 10 s, with the Ray file beside the fault file)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with multi-process runs first, the longest of them first: the suite's two
    xdist workers take whole files in this order, so the long runs start early and the
    quick files fill in the end of both (a long run taken last would leave one worker idle)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[bool, int]:
        name = item.path.name
        longest = LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
        return item.path not in slow_files, longest

    items.sort(key=rank)


def make_config(overrides: list[str] = (), experiment: str = "cartpole_ppo") -> ExperimentConfig:
    """A shipped experiment's config (the default's unless named) with `key=value`
    overrides."""
    values = yaml.safe_load((REPO / "configs" / f"{experiment}.yaml").read_text())
    return config_from_dict(apply_overrides(values, list(overrides)))


def write_run_dir(run_dir: Path, config: ExperimentConfig) -> Path:
    """A run directory as the launcher leaves it, so workers can start in it."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    resolved = resolve_algorithms(config)  # the chosen algorithm's section written whole
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(resolved)))
    return run_dir


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def shm_dir(run_dir: Path) -> Path | None:
    """The shared-memory directory of a run's workers, as its status.json names it
    (srl_jax/wire/shm/place.py)."""
    path = read_status(run_dir).get("shared_memory")
    return Path(path) if path else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone; reading an exiting one's stat can fail ESRCH
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc (a run's workers, Ray's servers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


class Processes:
    """Processes a test started; all are killed by pid when the test ends."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path | None = None, stderr_to: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a process; stdout (and stderr, unless `stderr_to`) goes to `log`."""
        with open(log or os.devnull, "ab") as out, open(stderr_to or os.devnull, "ab") as err:
            process = subprocess.Popen(args, stdout=out,
                                       stderr=err if stderr_to else subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL,
                                       env=None if env is None else {**os.environ, **env})
        self.started.append(process)
        return process

    def worker(self, kind: str, index: int, run_dir: Path) -> subprocess.Popen:
        return self.start([sys.executable, "-m", "srl_jax.worker", kind, str(index),
                           "--run-dir", str(run_dir)], log=run_dir / "logs" / f"{kind}-{index}.log")

    @staticmethod
    def kill(pid: int) -> None:
        """SIGKILL one process by pid (ignored if it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()


def worker(status: dict | None, name: str) -> dict | None:
    return next((w for w in (status or {}).get("workers", []) if w["name"] == name), None)


def all_running(run_dir: Path) -> bool:
    status = read_status(run_dir)
    return bool(status) and all(w["state"] == "running" for w in status["workers"])


def wait_restarted(run_dir: Path, name: str, victim: int, timeout: float,
                   restarts: int = 1) -> dict:
    """Wait until worker `name` runs again under a new pid, restarted `restarts` times in
    all; its record."""
    return wait_for(
        lambda: (w := worker(read_status(run_dir), name)) and w["restarts"] == restarts
        and w["state"] == "running" and w["pid"] != victim and w, timeout, f"{name} restarted")


def logged_env_seeds(run_dir: Path, actor: int) -> dict[Incarnation, list[list[int]]]:
    """The env seeds of each split that each start of actor `actor` logged, by incarnation."""
    log = (run_dir / "logs" / f"actor-{actor}.log").read_text()
    return {Incarnation(int(resumes), int(restarts)): json.loads(seeds)
            for resumes, restarts, seeds in SEEDS_LOGGED.findall(log)}


CARTPOLE_RANDOM_RETURN = 22.2
"""CartPole-v1's mean return with uniformly random actions: 22.2 over 5,000 episodes
(standard deviation 11.9, the largest 114)."""
CARTPOLE_MARGIN = 80
"""How far the mean return of 100 of a CartPole run's episodes must beat random play's to
show learning: 102 is 65 standard errors above it (1.2 for 100 episodes), and about half
of the least the suite's runs reached within their frame budgets (see their tests)."""


def ended_on_frames(process: subprocess.Popen, run_dir: Path, frames: int, log: Path,
                    timeout: float = 280) -> tuple[list[dict], dict]:
    """Wait for a run that must stop on its frame budget `frames` (exit 0, its learner
    having updated); its metrics rows and final status. `timeout` guards against a hang.
    A budget covers what the learner trains on and what actors step before its first
    update, which the stream's and the learner's queues bound (the default experiment on
    Ray: 58,000 frames, once), not the time it takes."""
    assert process.wait(timeout=timeout) == 0, log.read_text()
    rows, final = read_metrics(run_dir), read_status(run_dir)
    assert final["state"] == "finished" and final["stop_reason"].endswith(
        f"env frames reached the limit {frames}"), final["stop_reason"]
    assert rows[-1]["env_frames"] >= frames and rows[-1]["learner_steps"] > 0
    return rows, final


def assert_learned(rows: list[dict], random_return: float, margin: float) -> None:
    """Some 100 consecutive episodes of the run beat random play's mean return by `margin`
    (the best of the rows' `episode_return_mean_last100`). The best, not the last: a test
    asserts learning, and IMPALA on CartPole once unlearned after it (tests/test_run.py)."""
    assert sum(r.get("episodes", 0) for r in rows) >= 100, "a full window of episodes"
    best = max(r.get("episode_return_mean_last100", 0) for r in rows)
    assert best >= random_return + margin, (
        f"best mean return of 100 episodes {best}, random play's {random_return} + {margin}; "
        f"by frames: {[(r['env_frames'], r.get('episode_return_mean')) for r in rows]}")


def last_row(run_dir: Path) -> dict:
    """The newest metrics row, or {} before the first."""
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    return rows[-1] if rows else {}


def stop_when(process: subprocess.Popen, run_dir: Path, until: Callable[[dict], bool],
              timeout: float, log: Path) -> list[dict]:
    """Wait for a metrics row that satisfies `until`, then Ctrl-C the launcher; the rows.
    A frame limit could arrive before what a test observes: it waits for the observation."""
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: process.poll() is not None
             or (metrics.is_file() and any(until(row) for row in read_metrics(run_dir))),
             timeout, "the metrics row the test waits for")
    assert process.poll() is None, f"the run ended first:\n{log.read_text()}"
    interrupt(process, log)
    return read_metrics(run_dir)


def interrupt(process: subprocess.Popen, log: Path) -> None:
    """Ctrl-C the launcher: it stops the run and exits 130 (interrupted)."""
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130, log.read_text()


def read_events(directory: Path) -> list[event_pb2.Event]:
    """Records of a TensorBoard event file: length, its CRC, the Event, its CRC."""
    (path,) = directory.glob("events.out.tfevents.*")
    data, events, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = event_pb2.Event()
        event.ParseFromString(data[offset + 12:offset + 12 + length])
        events.append(event)
        offset += 12 + length + 4
    return events


def launch(processes: Processes, tmp_path: Path, *overrides: str,
           experiment: str = "cartpole_ppo", env: dict[str, str] | None = None,
           options: tuple[str, ...] = ()) -> tuple:
    """Start the launcher on `experiment` with `options` (e.g. --backend ray) and
    `--set` overrides; (its process, the run directory)."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", experiment, "--run-dir", str(run_dir),
            *options]
    for override in overrides:
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log", env=env)
    return process, run_dir


@pytest.fixture
def processes() -> Iterator[Processes]:
    group = Processes()
    yield group
    group.stop_all()


@pytest.fixture
def stats_socket(tmp_path: Path) -> Iterator[zmq.Socket]:
    """Stands in for the controller: the stats stream workers report to."""
    socket = make_socket(zmq.Context.instance(), STATS.bind_type)
    Transport(zmq.Context.instance()).bind(socket, FileNameService(tmp_path / "run" / "names"),
                                           STATS.key())
    yield socket
    socket.close()


S3_BUCKET = "srl-jax-checkpoints"


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty bucket on an S3 server on loopback (moto's), as `s3://bucket`: the standard
    AWS variables point s3fs, tensorstore and every process the test starts at it."""
    import s3fs
    from moto import backends
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    # moto's server lists its package's folders on every request to tell a service's name
    # from a host's: some 200 stat calls a request, most of the S3 checkpoint test's 20 s
    modules = tuple(backends.list_of_moto_modules())
    monkeypatch.setattr(backends, "list_of_moto_modules", lambda: modules)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = "http://{}:{}".format(*server.get_host_and_port())
    # moto keeps its buckets per process, whatever the server: empty them
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))
    for key, value in {"AWS_ENDPOINT_URL": endpoint,
                       "AWS_ACCESS_KEY_ID": "srl-jax", "AWS_SECRET_ACCESS_KEY": "srl-jax",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():  # no instance lookups
        monkeypatch.setenv(key, value)
    forget_s3_filesystems()  # made for an earlier server
    try:
        s3fs.S3FileSystem().mkdir(S3_BUCKET)
        yield f"s3://{S3_BUCKET}"
    finally:
        forget_s3_filesystems()
        server.stop()


def forget_s3_filesystems() -> None:
    """Drop the s3fs instances made for an earlier endpoint: fsspec's, and the one epath
    keeps for the life of the process (an lru_cache on its backend's method)."""
    import s3fs
    from etils.epath import backend

    s3fs.S3FileSystem.clear_instance_cache()
    backend._FileSystemSpecBackend._get_filesystem.cache_clear()
