"""srl_jax against its peers, side by side on this machine, in one run.

Cases (``--cases``, default all):

- ``cartpole``: CartPole-v1 to a return of 475. srl_jax (``cartpole_ppo``, the
  default experiment), Sample Factory's APPO with the CartPole settings its
  ``sf_examples.train_gym_env`` documents (bench/sample_factory_peer.py, in its
  own virtual environment), and the single-process cleanrl-style JAX PPO
  (bench/cleanrl_ppo.py). Figures: steady env frames/s, wall time from launch
  to the first report of a mean return >= 475, and the env frames it took, for
  each return window a system reports: its own row (srl_jax and the baseline:
  the episodes that ended within a 1 s row; Sample Factory: its last 100
  episodes), and the mean of the last 20 and of the last 100 episodes
  (``episode_return_mean_last20`` / ``_last100``, from every episode's return).
  srl_jax and the baseline run until every window reached 475 (or the budget).
- ``dqn``: CartPole-v1 to an evaluation return of 475: srl_jax's Ape-X DQN
  (``cartpole_dqn``) against the single-process cleanrl-style DQN with the same
  config, network and update (bench/cleanrl_dqn.py). The return is each side's
  greedy evaluation (``eval_return_mean``: 5 episodes, the evaluator's seeds);
  the figures as for ``cartpole``, and srl_jax / peer ratios of all three.
- ``sampling``: pure sampling throughput, learning negligible: srl_jax with a
  one-epoch, one-minibatch learner and Sample Factory in its sampling mode, for
  ``--sampling-seconds`` each, against the raw env stepping rate on the same
  cores (one stepping process per core, random actions, no sockets, no policy:
  the physical limit for that env on this machine).
- ``pong``: ALE Pong-v5 sampling through remote batched inference with the
  Nature-CNN (``atari_pong_impala``, samples dropped rather than waited on when
  the CPU learner lags), against raw ALE stepping on the same cores. Needs the
  ``[atari]`` extra; skipped with a message without it.

The systems run alternately (A B C, A B C, ... ``--rounds`` times, at least 3),
each from a fresh process, and each side's figures come from its own logs. A
ratio is srl_jax / peer within one round; the table gives the median with min
and max over rounds. Results go to ``bench/results/compare_<case>.json`` with the
machine's description; ``bench/report.py`` turns them into the README tables.

    .venv/bin/python bench/compare.py                       # every case, 3 rounds
    .venv/bin/python bench/compare.py --cases cartpole --rounds 5
    .venv/bin/python bench/compare.py --cases dqn

Every process is started in its own session and stopped by its pid (process
group), never by name; Ctrl-C stops the one running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sample_factory_peer
from e2e_fps import REPO_ROOT, raw_env_rates, read_rows, stop_process
from machine import config_hash, nproc, release_workdir, write_results

from srl_jax.config.run_dir import read_status
from srl_jax.core.metrics_table import RETURN_WINDOWS

TARGET_RETURN = 475.0
POLL_S = 0.5
ROLLING_WINDOWS = {f"last{n}": f"episode_return_mean_last{n}" for n in RETURN_WINDOWS}
"""Return window -> the row key of the mean over that many last episodes (srl_jax's
metrics rows and bench/cleanrl_ppo.py's lines carry them)."""

SAMPLING_OVERRIDES = ("stop.target_return=null", "learner.ppo.epochs=1",
                      "learner.ppo.minibatches=1", "checkpoint.enabled=false")
"""srl_jax with learning negligible: one gradient step per batch, no checkpoints."""
PONG_OVERRIDES = ("actors.count=2", "actors.envs=16", "actors.splits=2",
                  "actors.send_policy=drop", "inference.max_batch=16", "learner.batch_envs=32",
                  "checkpoint.enabled=false", "stop.env_frames=0")
"""Two actors of 16 Pongs in two splits (the best K, S of bench/actor.py); an actor
drops a chunk rather than waiting for the CPU learner, so this is the sampling rate."""


@dataclass
class Launch:
    """One system's process for one run: how to start it, read it and stop it."""

    command: list[str]
    read: Callable[[Path], list[dict[str, Any]]]
    """Progress rows so far from the run's own logs: `wall` (epoch s), `env_frames`,
    and `return_key` where the system reported one."""
    env: dict[str, str] = field(default_factory=dict)
    stop: Callable[[subprocess.Popen, Path], None] | None = None
    return_key: str = "episode_return_mean"
    """The rows' return that the target is on (`eval_return_mean`: greedy evaluations)."""
    windows: dict[str, str] = field(default_factory=dict)
    """Return window ("last20", "last100") -> the row key of the system's mean over it;
    the run goes on until each of them and `return_key` reached the target."""


@dataclass
class RunFigures:
    startup_s: float | None
    fps: float | None
    frames: int
    wall_s: float
    time_to_target_s: float | None = None
    frames_to_target: int | None = None
    best_return: float | None = None
    windows: dict[str, float | int | None] = field(default_factory=dict)
    """`time_to_target_<window>_s` and `frames_to_target_<window>` of each return window."""

    def figure(self, name: str) -> float | int | None:
        """A figure by name, a window's included (None where the run has no such figure)."""
        return self.windows.get(name) if name in self.windows else getattr(self, name, None)

    def as_dict(self) -> dict[str, Any]:
        flat = {**{k: v for k, v in vars(self).items() if k != "windows"}, **self.windows}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in flat.items()}


# ------------------------------------------------------------------ systems


def srl_jax_launch(experiment: str, workdir: Path, overrides: tuple[str, ...],
                   seconds: float, return_key: str = "episode_return_mean",
                   windows: dict[str, str] | None = None) -> Launch:
    command = [sys.executable, "-m", "srl_jax.launch", experiment, "--run-dir",
               str(workdir / "run"), "--quiet", "--set", f"stop.wall_time_s={seconds:g}"]
    for override in overrides:
        command += ["--set", override]
    return Launch(command, read_srl_jax, stop=lambda p, d: stop_process(p, d / "run"),
                  return_key=return_key, windows=windows or {})


def srl_jax_config(experiment: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """What a case ran of srl_jax, for its results: the config, its file's hash and the
    overrides (besides each round's seed and the budget's wall time)."""
    return {"experiment": experiment, "config_sha256": config_hash(experiment),
            "overrides": list(overrides)}


def read_srl_jax(workdir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, timed from the controller's start in status.json."""
    run_dir = workdir / "run"
    try:
        started = (read_status(run_dir) or {})["started"]
        rows = read_rows(run_dir / "metrics.jsonl")
    except (OSError, ValueError, KeyError):
        return []
    return [{**row, "wall": started + row["time"]} for row in rows]


def cleanrl_launch(workdir: Path, seed: int, seconds: float, script: str = "cleanrl_ppo.py",
                   return_key: str = "episode_return_mean",
                   windows: dict[str, str] | None = None) -> Launch:
    """A single-process baseline in bench/ (`script`), which prints JSON lines; with
    `windows` it does not stop itself at the target: the harness stops it once every
    window got there."""
    target = "none" if windows else f"{TARGET_RETURN:g}"
    command = [sys.executable, str(REPO_ROOT / "bench" / script), "--seed", str(seed),
               "--target-return", target, "--seconds", f"{seconds:g}"]
    return Launch(command, read_json_lines, return_key=return_key, windows=windows or {})


def read_json_lines(workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (workdir / "out.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and "wall" in row and "env_frames" in row:
                rows.append(row)
    return rows


def sample_factory_launch(workdir: Path, seed: int, seconds: float,
                          sampling_only: bool = False) -> Launch:
    python = sample_factory_peer.ensure_venv(sample_factory_peer.DEFAULT_CACHE_DIR)
    command, env = sample_factory_peer.train_command(
        python, workdir / "train_dir", "bench", seed=seed, seconds=seconds,
        sampling_only=sampling_only)
    return Launch(command, lambda d: sample_factory_peer.read_trace(
        (d / "out.log").read_text(errors="replace")), env=env,
        windows={"last100": "episode_return_mean"})  # its --stats_avg of 100 episodes


# ------------------------------------------------------------------ one run


def solved_at(rows: list[dict[str, Any]], target: float,
              key: str = "episode_return_mean") -> dict[str, Any] | None:
    return next((r for r in rows if (r.get(key) or -1e30) >= target), None)


def all_solved(rows: list[dict[str, Any]], target: float, keys: list[str]) -> bool:
    """Whether every one of the returns `keys` has reached the target in some row."""
    return all(solved_at(rows, target, key) for key in keys)


def run_once(launch: Launch, workdir: Path, budget_s: float,
             target: float | None) -> RunFigures:
    """Start the system, stop it once its return and each window's reached the target or
    after `budget_s`, and read its figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    launched = time.time()
    with (workdir / "out.log").open("wb") as out:
        process = subprocess.Popen(launch.command, cwd=REPO_ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **launch.env}, start_new_session=True)
    try:
        while process.poll() is None and time.time() - launched < budget_s:
            if target is not None and all_solved(
                    launch.read(workdir), target, [launch.return_key, *launch.windows.values()]):
                break
            time.sleep(POLL_S)
    finally:
        if launch.stop is None:
            sample_factory_peer.stop_group(process)  # Ctrl-C, then the process group
        else:
            launch.stop(process, workdir)
    rows = launch.read(workdir)
    return figures(rows, launched, target, launch.return_key, launch.windows)


def figures(rows: list[dict[str, Any]], launched: float, target: float | None,
            key: str = "episode_return_mean",
            windows: dict[str, str] | None = None) -> RunFigures:
    """Steady fps from the first row with frames to the last; time to target (a row's
    `key` >= target) from launch, and so for each window's key."""
    started = next((r for r in rows if r["env_frames"] > 0), None)
    last = rows[-1] if rows else None
    fps = None
    if started is not None and last["wall"] > started["wall"]:
        fps = (last["env_frames"] - started["env_frames"]) / (last["wall"] - started["wall"])
    returns = [r[key] for r in rows if r.get(key) is not None]
    result = RunFigures(startup_s=started["wall"] - launched if started else None, fps=fps,
                        frames=last["env_frames"] if last else 0,
                        wall_s=(last["wall"] - launched) if last else 0.0,
                        best_return=max(returns) if returns else None)
    if target is None:
        return result
    if hit := solved_at(rows, target, key):
        result.time_to_target_s, result.frames_to_target = hit["wall"] - launched, \
            hit["env_frames"]
    for window, window_key in (windows or {}).items():
        hit = solved_at(rows, target, window_key)
        result.windows[f"time_to_target_{window}_s"] = hit["wall"] - launched if hit else None
        result.windows[f"frames_to_target_{window}"] = hit["env_frames"] if hit else None
    return result


# ------------------------------------------------------------------ summaries


def spread(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def ratio_rounds(runs: dict[str, list[RunFigures]], ours: str, peer: str,
                 key: str) -> list[float]:
    """ours / peer of one figure, round by round (a round missing either side is left out)."""
    ratios = []
    for a, b in zip(runs[ours], runs[peer], strict=True):
        x, y = a.figure(key), b.figure(key)
        if x is not None and y:
            ratios.append(x / y)
    return ratios


def _cell(summary: dict[str, float] | None, spec: str) -> str:
    if summary is None:
        return "-"
    return (f"{format(summary['median'], spec)} [{format(summary['min'], spec)}-"
            f"{format(summary['max'], spec)}]")


def print_table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


# ------------------------------------------------------------------ raw stepping


def _raw_worker(env: dict[str, Any], num_envs: int, seconds: float, seed: int) -> float:
    return statistics.median(raw_env_rates(env, num_envs, seconds, seed=seed))


def raw_rate_on_all_cores(env: dict[str, Any], num_envs: int, seconds: float) -> float:
    """Env steps/s of one stepping process per core, all at once, summed."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(nproc()) as pool:
        rates = pool.starmap(_raw_worker, [(env, num_envs, seconds, 1000 * i)
                                           for i in range(nproc())])
    return sum(rates)


# ------------------------------------------------------------------ cases


def rounds_of(systems: dict[str, Callable[[Path, int], Launch]], args: argparse.Namespace,
              workdir: Path, budget_s: float, target: float | None) -> dict[str, list[RunFigures]]:
    runs: dict[str, list[RunFigures]] = {name: [] for name in systems}
    for round_index in range(args.rounds):
        for name, make in systems.items():
            seed = round_index + 1
            print(f"  round {round_index + 1}/{args.rounds}: {name} ...", end=" ", flush=True)
            run_dir = workdir / f"{name}-{seed}"
            result = run_once(make(run_dir, seed), run_dir, budget_s, target)
            runs[name].append(result)
            solved = "" if target is None else (
                f", {TARGET_RETURN:g} at {result.time_to_target_s:.1f}s"
                if result.time_to_target_s is not None else ", target not reached")
            fps = f"{result.fps:,.0f} fps" if result.fps else "no frames"
            print(f"{fps}{solved}", flush=True)
    return runs


def window_figures(results: list[RunFigures]) -> list[str]:
    """The window figures (`time_to_target_last20_s`, ...) the runs have, in order."""
    return list(dict.fromkeys(name for r in results for name in r.windows))


def system_summaries(runs: dict[str, list[RunFigures]]) -> dict[str, Any]:
    """Each system's figures over the rounds (a window's `n`: the runs that reached it)."""
    return {name: {"fps": spread([r.fps for r in results]),
                   "startup_s": spread([r.startup_s for r in results]),
                   "time_to_target_s": spread([r.time_to_target_s for r in results]),
                   "frames_to_target": spread([r.frames_to_target for r in results]),
                   "solved": sum(r.time_to_target_s is not None for r in results),
                   **{figure: spread([r.figure(figure) for r in results])
                      for figure in window_figures(results)},
                   "runs": [r.as_dict() for r in results]} for name, results in runs.items()}


RATIO_FIGURES = {"fps": "fps_ratio", "time_to_target_s": "time_to_475_ratio",
                 "frames_to_target": "frames_to_475_ratio",
                 **{f"time_to_target_{w}_s": f"time_to_475_{w}_ratio" for w in ROLLING_WINDOWS},
                 **{f"frames_to_target_{w}": f"frames_to_475_{w}_ratio" for w in ROLLING_WINDOWS}}
"""RunFigures field -> the name of its srl_jax / peer ratio in the results."""


def budget(args: argparse.Namespace, case: str) -> float:
    """Seconds a run of `case` may take to reach its target: --budget, or the case's own."""
    return args.budget if args.budget is not None else BUDGETS_S[case]


def target_case(args: argparse.Namespace, workdir: Path,
                systems: dict[str, Callable[[Path, int], Launch]], title: str,
                ratio_of: tuple[str, ...], budget_s: float) -> dict[str, Any]:
    """Rounds of `systems` (srl_jax first, then its peers) to TARGET_RETURN, their
    figures, and srl_jax / peer ratios of the `ratio_of` figures (RATIO_FIGURES) and of
    the window figures both sides have (the same window on both sides)."""
    runs = rounds_of(systems, args, workdir, budget_s, TARGET_RETURN)
    summary = system_summaries(runs)
    result: dict[str, Any] = {"target_return": TARGET_RETURN, "rounds": args.rounds,
                              "budget_s": budget_s, "systems": summary, "ratios": {}}
    ours = window_figures(runs["srl_jax"])
    for peer in [name for name in systems if name != "srl_jax"]:
        shared = [figure for figure in window_figures(runs[peer]) if figure in ours]
        for key in [*ratio_of, *shared]:
            ratios = spread(ratio_rounds(runs, "srl_jax", peer, key))
            result["ratios"][f"{RATIO_FIGURES[key]}_vs_{peer}"] = ratios
            result[f"{RATIO_FIGURES[key]}_vs_{peer}"] = ratios["median"] if ratios else None
    rows = [(name, _cell(s["fps"], ",.0f"), _cell(s["startup_s"], ".1f"),
             _cell(s["time_to_target_s"], ".1f"), _cell(s["frames_to_target"], ",.0f"),
             f"{s['solved']}/{args.rounds}") for name, s in summary.items()]
    print_table(f"{title}: median [min-max] over {args.rounds} rounds",
                rows, ("system", "env frames/s", "start-up s", f"time to {TARGET_RETURN:g} s",
                       f"frames to {TARGET_RETURN:g}", "solved"))
    windows = [w for w in ROLLING_WINDOWS if any(f"time_to_target_{w}_s" in s
                                                 for s in summary.values())]
    if windows:
        print_table(f"to {TARGET_RETURN:g} by the mean of the last N episodes",
                    [(name, *(cell for w in windows for cell in (
                        _cell(s.get(f"time_to_target_{w}_s"), ".1f"),
                        _cell(s.get(f"frames_to_target_{w}"), ",.0f"))))
                     for name, s in summary.items()],
                    ("system", *(c for w in windows for c in (f"time, {w} s", f"frames, {w}"))))
    ratio_rows = [(key, _cell(value, ".2f")) for key, value in result["ratios"].items()]
    print_table("srl_jax / peer, round by round", ratio_rows, ("ratio", "median [min-max]"))
    return result


CARTPOLE_OVERRIDES = ("stop.target_return=null",)
"""The default experiment runs on past its own stop (a row's mean of 475) until the
harness has seen every window reach 475."""


def case_cartpole(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    seconds = budget(args, "cartpole")
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch(
            "cartpole_ppo", d, (f"seed={seed}", *CARTPOLE_OVERRIDES), seconds,
            windows=ROLLING_WINDOWS),
        "sample_factory": lambda d, seed: sample_factory_launch(d, seed, seconds),
        "cleanrl_ppo": lambda d, seed: cleanrl_launch(d, seed, seconds,
                                                      windows=ROLLING_WINDOWS),
    }
    result = target_case(args, workdir, systems, f"CartPole-v1 to {TARGET_RETURN:g}",
                         ("fps", "time_to_target_s"), seconds)
    return {**result, "srl_jax_config": srl_jax_config("cartpole_ppo", CARTPOLE_OVERRIDES)}


def case_dqn(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    key, seconds = "eval_return_mean", budget(args, "dqn")
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch("cartpole_dqn", d, (f"seed={seed}",),
                                                  seconds, key),
        "cleanrl_dqn": lambda d, seed: cleanrl_launch(d, seed, seconds, "cleanrl_dqn.py", key),
    }
    result = target_case(args, workdir, systems,
                         f"CartPole-v1 DQN to an evaluation return of {TARGET_RETURN:g}",
                         ("fps", "time_to_target_s", "frames_to_target"), seconds)
    return {**result, "return_key": key, "srl_jax_config": srl_jax_config("cartpole_dqn", ())}


def case_sampling(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    seconds = args.sampling_seconds
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch("cartpole_ppo", d,
                                                  (f"seed={seed}", *SAMPLING_OVERRIDES), seconds),
        "sample_factory": lambda d, seed: sample_factory_launch(d, seed, seconds,
                                                                sampling_only=True),
    }
    runs = rounds_of(systems, args, workdir, seconds + 60, None)
    print(f"  raw env stepping: {nproc()} processes x 16 CartPoles ...", flush=True)
    raw = raw_rate_on_all_cores({"id": "CartPole-v1"}, 16, args.raw_seconds)
    summary = system_summaries(runs)
    ours = summary["srl_jax"]["fps"]
    efficiency = ours["median"] / raw if ours else None
    ratios = spread(ratio_rounds(runs, "srl_jax", "sample_factory", "fps"))
    peer = summary["sample_factory"]["fps"]
    result = {"seconds": seconds, "rounds": args.rounds, "raw_env_steps_per_s": raw,
              "srl_jax_config": srl_jax_config("cartpole_ppo", SAMPLING_OVERRIDES),
              "systems": summary, "sampling_efficiency": efficiency,
              "sampling_efficiency_sample_factory": peer["median"] / raw if peer else None,
              "fps_ratio_vs_sample_factory": ratios["median"] if ratios else None,
              "ratios": {"fps_ratio_vs_sample_factory": ratios}}
    rows = [(name, _cell(s["fps"], ",.0f"),
             f"{s['fps']['median'] / raw:.2f}" if s["fps"] else "-")
            for name, s in summary.items()]
    rows.append((f"raw env stepping ({nproc()} procs)", f"{raw:,.0f}", "1.00"))
    print_table(f"CartPole-v1 sampling, learning negligible, {seconds:g}s runs",
                rows, ("system", "env frames/s", "/ raw"))
    print(f"srl_jax / sample_factory fps: {_cell(ratios, '.2f')}")
    return result


def case_pong(args: argparse.Namespace, workdir: Path) -> dict[str, Any] | None:
    try:
        import ale_py  # noqa: F401
    except ImportError:
        print("  skipped: needs the [atari] extra (pip install 'srl-jax[atari]')")
        return None
    seconds = args.pong_seconds
    systems = {"srl_jax": lambda d, seed: srl_jax_launch(
        "atari_pong_impala", d, (f"seed={seed}", *PONG_OVERRIDES), seconds)}
    runs = rounds_of(systems, args, workdir, seconds + 120, None)
    config = yaml.safe_load((REPO_ROOT / "configs" / "atari_pong_impala.yaml").read_text())
    print(f"  raw ALE stepping: {nproc()} processes x 8 Pongs ...", flush=True)
    raw = raw_rate_on_all_cores(config["env"], 8, args.raw_seconds)
    summary = system_summaries(runs)
    ours = summary["srl_jax"]["fps"]
    result = {"seconds": seconds, "rounds": args.rounds, "raw_env_steps_per_s": raw,
              "srl_jax_config": srl_jax_config("atari_pong_impala", PONG_OVERRIDES),
              "systems": summary, "sampling_efficiency": ours["median"] / raw if ours else None}
    rows = [("srl_jax (Nature-CNN, remote inference)", _cell(ours, ",.0f"),
             f"{ours['median'] / raw:.2f}" if ours else "-"),
            (f"raw ALE stepping ({nproc()} procs)", f"{raw:,.0f}", "1.00")]
    print_table(f"ALE Pong-v5 sampling (agent steps/s; 4 emulator frames each), {seconds:g}s runs",
                rows, ("system", "steps/s", "/ raw"))
    return result


BUDGETS_S = {"cartpole": 180.0, "dqn": 300.0}
"""Default --budget per case."""
CASES = {"cartpole": case_cartpole, "dqn": case_dqn, "sampling": case_sampling,
         "pong": case_pong}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/compare.py", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--rounds", type=int, default=3, help="A B C rounds (at least 3)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds a CartPole run (cartpole, dqn) may take to reach 475 "
                             "(default: 180 for cartpole; 300 for dqn, its issue's bound)")
    parser.add_argument("--sampling-seconds", type=float, default=30.0)
    parser.add_argument("--pong-seconds", type=float, default=60.0)
    parser.add_argument("--raw-seconds", type=float, default=6.0)
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: a ratio from fewer rounds is noise")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    workdir = Path(tempfile.mkdtemp(prefix="srl_compare_"))
    try:
        for case in args.cases:
            print(f"case {case}:", flush=True)
            result = CASES[case](args, workdir / case)
            if result is not None:
                print(f"results: {write_results(f'compare_{case}', result)}", flush=True)
    except KeyboardInterrupt:
        return 130
    finally:
        release_workdir(workdir, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
