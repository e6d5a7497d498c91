"""Sample Factory (APPO) on CartPole-v1 as a peer for the benchmarks, in its own venv.

Why a venv of its own: sample-factory 2.1.1 pins ``numpy<2`` and ``gymnasium<1.0``,
which the project's environment does not have. ``ensure_venv`` builds one under the
cache dir (default ``~/.cache/srl_jax/bench/sample_factory-venv``, outside the repo)
with ``torch==2.13.0`` (the CPU wheel on this machine's disk; an unpinned ``torch``
would download a multi-GB CUDA build). Importing this module needs only the standard
library; Sample Factory runs in a subprocess started from ``train_command``.

What runs: the example ``python -m sf_examples.train_gym_env`` with the CartPole
settings its docstring documents (sample-factory 2.1.1,
``sf_examples/train_gym_env.py``)::

    Example command line for CartPole-v1:
    python -m sf_examples.train_gym_env --algo=APPO --use_rnn=False
    --num_envs_per_worker=20 --policy_workers_per_policy=2 --recurrence=1
    --with_vtrace=False --batch_size=512 --reward_scale=0.1 --save_every_sec=10
    --experiment_summaries_interval=10 --experiment=example_gym_cartpole-v1
    --env=CartPole-v1

plus ``--device=cpu``, the caller's ``--train_dir`` and ``--experiment``, ``--seed``
and ``--train_for_seconds``. Everything else is Sample Factory's default: as many
rollout workers as CPU cores (2 here), rollout 32, one epoch of one 512-sample batch
per update, non-batched sampling.

Time limit: ``--train_for_seconds`` is parsed by 2.1.1 but never takes effect (its
``Runner.total_train_seconds`` is never advanced, fixed upstream after the release
by sample-factory pull request #330), so the command runs under coreutils
``timeout --foreground``, which sends one SIGINT to Sample Factory's main process
``seconds`` after launch (Ctrl-C, which it handles: it saves a checkpoint, stops its
workers, which ignore SIGINT, and exits) and SIGKILL ``STOP_GRACE_S`` later if it is
still there. Without ``--foreground`` timeout would signal the main process twice
(directly and through its process group), and the second SIGINT can cut the shutdown
short. The flag is still passed so that the command says what it means and works on a
fixed release.

Progress comes from Sample Factory's own log on stdout/stderr (see ``read_trace``).

    .venv/bin/python -m bench.peers.sample_factory                 # 60 s smoke run
    .venv/bin/python -m bench.peers.sample_factory --seconds 180
    .venv/bin/python -m bench.peers.sample_factory --sampling-only --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SAMPLE_FACTORY_VERSION = "2.1.1"
REQUIREMENTS: tuple[str, ...] = (
    f"sample-factory=={SAMPLE_FACTORY_VERSION}",
    "torch==2.13.0",
    "numpy==1.26.4",
    "gymnasium==0.29.1",
    "signal-slot-mp==1.0.5",
)
"""What the venv holds, pinned: Sample Factory, the CPU torch on this machine's disk,
and the versions pip resolved for the packages that shape the run (the CartPole
implementation, the arrays, Sample Factory's process plumbing)."""
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "srl_jax/bench")
VENV_NAME = "sample_factory-venv"
STAMP_NAME = "srl_jax-requirements.txt"
"""Written into the venv after a successful install; the venv is rebuilt when it differs."""

CARTPOLE_ARGS: tuple[str, ...] = (
    "--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20",
    "--policy_workers_per_policy=2", "--recurrence=1", "--with_vtrace=False",
    "--batch_size=512", "--reward_scale=0.1", "--save_every_sec=10",
    "--experiment_summaries_interval=10", "--env=CartPole-v1",
)
"""The CartPole-v1 settings of ``sf_examples/train_gym_env.py``'s docstring, less its
``--experiment`` (the caller names it)."""
STOP_GRACE_S = 20
"""How long Sample Factory gets to stop after the SIGINT before ``timeout`` kills it."""
SAMPLER_CHILD = "--sampler-child"
"""argv[1] that makes this file run Sample Factory's sampler (inside the SF venv)."""
SAMPLER_REPORT_S = 1.0
"""Report interval of the sampler child, as in ``sf_examples/sampler``."""


# ------------------------------------------------------------------ venv


_VERSIONS_SCRIPT = (
    "import importlib.metadata, gymnasium, numpy, sample_factory, sf_examples, torch; "
    "print(f'torch {torch.__version__}, numpy {numpy.__version__}, '"
    "f'gymnasium {gymnasium.__version__}, '"
    "f'sample-factory {importlib.metadata.version(\"sample-factory\")}')")
"""Imports what the runs need and prints the versions: proves the install works."""


def _log(message: str) -> None:
    print(f"[sample_factory_peer] {message}", file=sys.stderr, flush=True)


def ensure_venv(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Create (once) the venv that runs Sample Factory; return its python.

    Its packages cannot live in the project's environment (numpy<2, gymnasium<1.0),
    so they go to ``cache_dir/sample_factory-venv``. The stamp file holds the pinned
    requirement list; when it matches, this returns at once without running anything.
    Otherwise the venv is rebuilt from scratch (``venv --clear``) so that it holds
    exactly the pinned set, which takes a few minutes. A lock file serialises
    concurrent callers.
    """
    venv = Path(cache_dir).expanduser() / VENV_NAME
    python = venv / "bin" / "python"
    stamp = venv / STAMP_NAME
    wanted = "".join(f"{req}\n" for req in REQUIREMENTS)

    def ready() -> bool:
        try:
            return python.exists() and stamp.read_text() == wanted
        except OSError:
            return False

    if ready():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{VENV_NAME}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready():  # another caller built it while this one waited
            return python
        started = time.monotonic()
        _log(f"creating {venv} (python {sys.version.split()[0]})")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        _log(f"pip install {' '.join(REQUIREMENTS)} (a few minutes)")
        subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                        "--quiet", *REQUIREMENTS], check=True)
        check = subprocess.run([str(python), "-P", "-c", _VERSIONS_SCRIPT], check=True,
                               capture_output=True, text=True,
                               env={**os.environ, "WANDB_MODE": "disabled"})
        _log(f"installed {check.stdout.strip()} in {time.monotonic() - started:.0f}s")
        stamp.write_text(wanted)
    return python


# --------------------------------------------------------------- command


def train_command(python: Path, train_dir: Path, experiment: str, *, seed: int, seconds: float,
                  sampling_only: bool = False) -> tuple[list[str], dict[str, str]]:
    """The command line that runs Sample Factory for ``seconds``, and the env vars to add.

    ``sampling_only=False``: APPO training, the example ``sf_examples.train_gym_env``
    with its documented CartPole settings (module docstring). Pass a fresh
    ``train_dir``: Sample Factory's default ``--restart_behavior=resume`` would
    continue from the checkpoints of an existing ``train_dir/experiment``.

    ``sampling_only=True``: pure sampling throughput with learning off. Sample
    Factory's ``--benchmark`` flag does not turn learning off (in 2.1.1 it only skips
    the experience decorrelation, 0 s by default, and the inference workers' CUDA
    cache cleanup), and no argument disables the learner. What Sample Factory offers
    for sampling alone is its sampler API, ``SyncSamplingAPI``
    (``sample_factory.algo.sampling.simplified_sampling_api``, shown by
    ``sf_examples/sampler/use_simplified_sampling_api.py``, which has no CLI for
    CartPole and no time limit): the same rollout and inference workers as training,
    with the same settings, a randomly initialised policy that is never updated, and
    no learner; the trajectories are handed to the main process and counted. This
    file runs it (``SAMPLER_CHILD``) with the venv's python. Its log gives
    "Samples collected: N, throughput: X FPS" lines, which ``read_trace`` reads.

    Both run under ``timeout --foreground -s INT`` (module docstring), with ``python -P`` so that
    the caller's working directory and this file's directory do not shadow imports. The
    sampler runs this file by its path, not as ``bench.peers.sample_factory``: the venv holds
    neither srl_jax nor this repository, so this file imports only the standard library.
    The env vars: ``WANDB_MODE=disabled`` (no Weights & Biases), ``TZ=UTC`` (the log's
    timestamps are local time; ``read_trace`` reads them as UTC), ``NO_COLOR=1`` (no
    ANSI colour codes in the log) and ``PYTHONUNBUFFERED=1``.
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be positive (timeout takes 0 as no limit): {seconds}")
    args = [*CARTPOLE_ARGS, "--device=cpu", f"--train_dir={train_dir}",
            f"--experiment={experiment}", f"--seed={seed}",
            f"--train_for_seconds={math.ceil(seconds)}"]
    if sampling_only:
        program = [str(python), "-P", str(Path(__file__).resolve()), SAMPLER_CHILD]
    else:
        program = [str(python), "-P", "-m", "sf_examples.train_gym_env"]
    command = [shutil.which("timeout") or "timeout", "--foreground", "--signal=INT",
               f"--kill-after={STOP_GRACE_S}", f"{seconds:.3f}", *program, *args]
    env = {"WANDB_MODE": "disabled", "TZ": "UTC", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    return command, env


def _sampler_child(argv: list[str]) -> int:
    """Sample Factory's sampler API on CartPole until SIGINT or ``--train_for_seconds``.

    Runs inside the SF venv. The loop is ``generate_trajectories`` of
    ``sf_examples/sampler/use_simplified_sampling_api.py`` with the CartPole env of
    ``sf_examples.train_gym_env`` and a deadline instead of a frame count; it logs with
    the example's ``_print_fps_stats`` every ``SAMPLER_REPORT_S``.
    """
    started = time.time()
    from collections import deque

    from sample_factory.algo.sampling.simplified_sampling_api import SyncSamplingAPI
    from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
    from sample_factory.algo.utils.rl_utils import samples_per_trajectory
    from sample_factory.utils.utils import log
    from sf_examples.sampler.use_simplified_sampling_api import _print_fps_stats
    from sf_examples.train_gym_env import parse_custom_args, register_custom_components

    register_custom_components()
    cfg = parse_custom_args(argv)
    env_info = obtain_env_info_in_a_separate_process(cfg)
    sampler = SyncSamplingAPI(cfg, env_info)
    sampler.start()
    fps_stats: deque[tuple[float, int]] = deque([(time.time(), 0)], maxlen=10)
    sampled = 0
    last_print = time.time()
    try:
        while time.time() - started < cfg.train_for_seconds:
            trajectory = sampler.get_trajectories_sync()
            if trajectory is None:
                break
            sampled += samples_per_trajectory(trajectory)
            if time.time() - last_print > SAMPLER_REPORT_S:
                fps_stats.append((time.time(), sampled))
                _print_fps_stats(cfg, fps_stats)
                last_print = time.time()
    except KeyboardInterrupt:
        log.info("KeyboardInterrupt in the sampler loop, stopping")
    status = sampler.stop()
    log.info(f"Sampler stopped after {sampled} samples, status {status}")
    return 0


# ------------------------------------------------------------------- log

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[(\d+)\] "
_FPS = re.compile(_PREFIX + r"Fps is \(.*\)\. Total num frames: (\d+)\.", re.MULTILINE)
_SAMPLES = re.compile(_PREFIX + r"Samples collected: (\d+), throughput", re.MULTILINE)
_REWARD = re.compile(_PREFIX + r"Avg episode reward: \[(.*)\]\s*$", re.MULTILINE)
_POLICY0 = re.compile(r"\(0, '([^']*)'\)")


def _wall(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()


def read_trace(log_text: str) -> list[dict[str, Any]]:
    """Progress rows from Sample Factory's log, as the benchmark harness reads every system.

    Rows ``{"wall": epoch s, "env_frames": int}``, one per periodic report, in log order:

    - training: ``[2026-12-02 19:32:08,555][10523] Fps is (10 sec: 1230.6, 60 sec:
      1230.6, 300 sec: 1230.6). Total num frames: 7168. Throughput: 0: 1482.2. Samples:
      7400. Policy #0 lag: (min: 0.0, avg: 1.6, max: 4.0)`` every 5 s from the runner;
      ``env_frames`` is "Total num frames", the env frames the learner has received.
      The runner's next line, ``[2026-12-02 19:32:08,556][10523] Avg episode reward:
      [(0, '37.650')]``, adds ``"episode_return_mean"`` (policy 0's entry; the list is
      empty before the first episode ends). That figure is the raw CartPole return:
      the rollout workers add up the env's rewards before ``--reward_scale`` scales
      them for the learner. It is the mean over the last ``--stats_avg`` (default 100)
      finished episodes of all envs, fewer at the start.
    - sampling only: ``[2026-12-02 19:57:19,063][19974] Samples collected: 44832,
      throughput: 3741.4 FPS`` every second; ``env_frames`` is the count (frames the
      sampler has handed to the main process).

    Timestamps are the logging module's ``asctime``, local time with milliseconds;
    ``train_command`` runs Sample Factory with ``TZ=UTC``, so they are read as UTC.
    ANSI colour codes, if any, are stripped first.
    """
    text = _ANSI.sub("", log_text)
    events: list[tuple[int, str, re.Match[str]]] = [
        (m.start(), kind, m) for kind, pattern in
        (("frames", _FPS), ("frames", _SAMPLES), ("reward", _REWARD))
        for m in pattern.finditer(text)]
    rows: list[dict[str, Any]] = []
    last_row_of: dict[str, dict[str, Any]] = {}
    for _, kind, match in sorted(events, key=lambda e: e[0]):
        stamp, pid, value = match.groups()
        if kind == "frames":
            row = {"wall": _wall(stamp), "env_frames": int(value)}
            rows.append(row)
            last_row_of[pid] = row
            continue
        row = last_row_of.get(pid)
        policy0 = _POLICY0.search(value)
        if row is not None and policy0 is not None and "episode_return_mean" not in row:
            with contextlib.suppress(ValueError):
                mean = float(policy0.group(1))
                if math.isfinite(mean):
                    row["episode_return_mean"] = mean
    return rows


# ------------------------------------------------------------- smoke run


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a run that outlived its limit: Ctrl-C, then SIGKILL its whole process group.

    The SIGINT goes to the ``timeout`` process alone, which passes it on to Sample
    Factory's main process (a SIGINT to the whole group would reach that process twice).
    Whatever is left after ``STOP_GRACE_S`` (workers included) is killed by process
    group, which the run leads (``start_new_session=True``), so by its pid.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
    deadline = time.monotonic() + 5.0
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # the workers exit once the main process has stopped them
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)


def _summary(rows: list[dict[str, Any]], launched: float, target: float) -> list[str]:
    if not rows:
        return ["no progress rows in the log"]
    lines = [f"rows: {len(rows)}", f"first: {rows[0]}", f"last:  {rows[-1]}"]
    started = next((r for r in rows if r["env_frames"] > 0), None)
    if started is not None:
        lines.append(f"start-up (launch to first row with frames): "
                     f"{started['wall'] - launched:.1f}s")
        span = rows[-1]["wall"] - started["wall"]
        if span > 0:
            fps = (rows[-1]["env_frames"] - started["env_frames"]) / span
            lines.append(f"steady env frames/s: {fps:,.0f} over {span:.0f}s")
    returns = [r["episode_return_mean"] for r in rows if "episode_return_mean" in r]
    if returns:
        lines.append(f"best episode_return_mean: {max(returns):.1f}")
        solved = next((r for r in rows if r.get("episode_return_mean", -math.inf) >= target),
                      None)
        lines.append(f"first mean >= {target:g}: " + (
            f"{solved['wall'] - launched:.1f}s after launch, {solved['env_frames']:,} frames"
            if solved else "not reached"))
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SAMPLER_CHILD]:
        return _sampler_child(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.sample_factory",
        description="Smoke run of the Sample Factory peer: set up its venv, run APPO on "
                    "CartPole-v1 for --seconds, print what read_trace gets from its log.")
    parser.add_argument("--seconds", type=float, default=60.0, help="run time (default: 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sampling-only", action="store_true",
                        help="Sample Factory's sampler alone, no learner")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                        help=f"where the venv lives (default: {DEFAULT_CACHE_DIR})")
    parser.add_argument("--target", type=float, default=475.0,
                        help="return to report the time to (default: 475)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    args = parser.parse_args(argv)

    python = ensure_venv(args.cache_dir)
    workdir = Path(tempfile.mkdtemp(prefix="sample_factory_peer."))
    command, env = train_command(python, workdir / "train_dir", "smoke", seed=args.seed,
                                 seconds=args.seconds, sampling_only=args.sampling_only)
    print(" ".join(command), flush=True)
    log_path = workdir / "out.log"
    launched = time.time()
    with log_path.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                   start_new_session=True)
    try:
        process.wait(timeout=args.seconds + 2 * STOP_GRACE_S + 10)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        print("still running past its limit; stopping it", flush=True)
    finally:
        stop_group(process)
    print(f"exit code {process.returncode} after {time.time() - launched:.1f}s; "
          f"process group left: {_group_alive(process.pid)}")
    for line in _summary(read_trace(log_path.read_text(errors="replace")), launched,
                         args.target):
        print(line)
    if args.keep:
        print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
