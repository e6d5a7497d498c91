"""srl_jax against its peers, side by side on this machine, in one run.

Cases (``--cases``, default all):

- ``cartpole``: CartPole-v1 to a return of 475. srl_jax (``cartpole_ppo``, the
  default experiment), Sample Factory's APPO with the CartPole settings its
  ``sf_examples.train_gym_env`` documents (``bench.peers.sample_factory``, in its
  own virtual environment), and the single-process cleanrl-style JAX PPO
  (``bench.peers.cleanrl_ppo``). Figures: steady env frames/s, wall time from launch
  to the first report of a mean return >= 475, and the env frames it took, for
  each return window a system reports: its own row (srl_jax and the baseline:
  the episodes that ended within a row, a row every ``ROW_INTERVAL_S`` (0.25 s)
  on both sides; Sample Factory: its last 100 episodes), and the mean of the
  last 20 and of the last 100 episodes (``episode_return_mean_last20`` /
  ``_last100``, from every episode's return). srl_jax and the baseline run until
  every window reached 475 (or the budget).
- ``dqn``: CartPole-v1 to an evaluation return of 475: srl_jax's Ape-X DQN
  (``cartpole_dqn``) against the single-process cleanrl-style DQN with the same
  config, network and update (``bench.peers.cleanrl_dqn``). The return is each side's
  greedy evaluation (``eval_return_mean``: 5 episodes, the evaluator's seeds);
  the figures as for ``cartpole``, and srl_jax / peer ratios of all three.
- ``sampling``: pure sampling throughput, learning negligible: srl_jax with a
  one-epoch, one-minibatch learner, sized for sampling (``SAMPLING_SIZES``) and at
  the default experiment's sizes, and Sample Factory in its sampling mode, for
  ``--sampling-seconds`` each, against the raw env stepping rate on the same
  cores (one stepping process per core, random actions, no sockets, no policy:
  the physical limit for that env on this machine).
- ``minatar``: MinAtar Breakout PPO to equal env frames (``--minatar-frames``, 3M):
  srl_jax (``minatar_breakout_ppo``) against the single-process PureJaxRL-style PPO
  (``bench.peers.purejaxrl_ppo``). Figures: steady env frames/s, start-up, wall time
  from launch to the frames, and the mean return of the last 100 episodes there.
- ``smax``: SMAX 3m MAPPO to equal env steps (``--smax-frames``, 1M): srl_jax
  (``smax_3m_mappo``) against the single-process JaxMARL-style MAPPO
  (``bench.peers.jaxmarl_mappo``); the figures as for ``minatar``, with the win rate
  of the last 100 episodes. In both, srl_jax runs its config as shipped (where it
  anneals the step size, over its own ``stop.env_frames``) and the harness stops it
  at the frames; the baseline gets the same schedule (``baseline_schedule``) and
  stops itself there (``--stop-frames``, at the last whole update before them).
- ``pong``: ALE Pong-v5 sampling through remote batched inference with the
  Nature-CNN (``atari_pong_impala``, samples dropped rather than waited on when
  the CPU learner lags), against raw ALE stepping on the same cores. Needs the
  ``[atari]`` extra; skipped with a message without it.

The systems run alternately (A B C, A B C, ... ``--rounds`` times, at least 3),
each from a fresh process, and each side's figures come from its own logs. A
ratio is srl_jax / peer within one round; the table gives the median with min
and max over rounds. Results go to ``bench/results/compare_<case>.json`` with the
machine's description; ``python -m bench.report`` turns them into the README tables.

    .venv/bin/python -m bench.peers.compare                 # every case, 3 rounds
    .venv/bin/python -m bench.peers.compare --cases cartpole --rounds 5
    .venv/bin/python -m bench.peers.compare --cases dqn
    .venv/bin/python -m bench.peers.compare --cases minatar smax    # about 3.5 hours

Every process is started in its own session and stopped by its pid (process
group), never by name; Ctrl-C stops the one running.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.harness.launcher import release_workdir
from bench.harness.machine import REPO_ROOT, nproc, write_results
from bench.harness.raw_stepping import raw_rate_on_all_cores
from bench.peers.rounds import rounds_of
from bench.peers.summary import (
    RATIO_FIGURES,
    cell,
    print_table,
    ratio_rounds,
    spread,
    system_summaries,
    window_figures,
)
from bench.peers.systems import (
    ROLLING_WINDOWS,
    TARGET_RETURN,
    Launch,
    cleanrl_launch,
    sample_factory_launch,
    srl_jax_config,
    srl_jax_launch,
)
from srl_jax.config.loader import load_config
from srl_jax.dataflow.algorithms import algorithm_config

SAMPLING_OVERRIDES = ("stop.target_return=null", "learner.ppo.epochs=1",
                      "learner.ppo.minibatches=1", "checkpoint.enabled=false")
"""srl_jax with learning negligible: one gradient step per batch, no checkpoints."""
SAMPLING_SIZES = ("actors.envs=256", "inference.max_batch=256", "learner.batch_envs=128")
"""The default experiment's two actors sized for sampling throughput: 256 CartPoles each
in its two splits (128-row requests, against 32 by default), which share the runtime's
per-request costs among four times the frames. The default sizes learn faster (more
updates per frame), so the default experiment keeps them; the sampling case runs both."""
PONG_OVERRIDES = ("actors.count=2", "actors.envs=16", "actors.splits=2",
                  "actors.send_policy=drop", "inference.max_batch=16", "learner.batch_envs=32",
                  "checkpoint.enabled=false", "stop.env_frames=0")
"""Two actors of 16 Pongs in two splits (the best K, S of bench.actor); an actor
drops a chunk rather than waiting for the CPU learner, so this is the sampling rate."""


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
    rows = [(name, cell(s["fps"], ",.0f"), cell(s["startup_s"], ".1f"),
             cell(s["time_to_target_s"], ".1f"), cell(s["frames_to_target"], ",.0f"),
             f"{s['solved']}/{args.rounds}") for name, s in summary.items()]
    print_table(f"{title}: median [min-max] over {args.rounds} rounds",
                rows, ("system", "env frames/s", "start-up s", f"time to {TARGET_RETURN:g} s",
                       f"frames to {TARGET_RETURN:g}", "solved"))
    windows = [w for w in ROLLING_WINDOWS if any(f"time_to_target_{w}_s" in s
                                                 for s in summary.values())]
    if windows:
        print_table(f"to {TARGET_RETURN:g} by the mean of the last N episodes",
                    [(name, *(text for w in windows for text in (
                        cell(s.get(f"time_to_target_{w}_s"), ".1f"),
                        cell(s.get(f"frames_to_target_{w}"), ",.0f"))))
                     for name, s in summary.items()],
                    ("system", *(c for w in windows for c in (f"time, {w} s", f"frames, {w}"))))
    ratio_rows = [(key, cell(value, ".2f")) for key, value in result["ratios"].items()]
    print_table("srl_jax / peer, round by round", ratio_rows, ("ratio", "median [min-max]"))
    return result


ROW_INTERVAL_S = 0.25
"""Seconds between the progress rows of srl_jax and the baseline in the cartpole case. A
time to 475 is read at the first row past it, so a row interval adds up to itself to the
figure: 1 s rows added up to 1 s to srl_jax's 4-5 s, a quarter of it. cleanrl logs at
every episode's end; a quarter second on both sides comes closer to that."""
CARTPOLE_OVERRIDES = ("stop.target_return=null", f"runtime.log_interval_s={ROW_INTERVAL_S:g}",
                      f"runtime.stats_interval_s={ROW_INTERVAL_S:g}")
"""The default experiment runs on past its own stop (a row's mean of 475) until the
harness has seen every window reach 475, writing a row (and its workers a heartbeat with
their counters) every ROW_INTERVAL_S."""


def case_cartpole(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    seconds = budget(args, "cartpole")
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch(
            "cartpole_ppo", d, (f"seed={seed}", *CARTPOLE_OVERRIDES), seconds,
            windows=ROLLING_WINDOWS),
        "sample_factory": lambda d, seed: sample_factory_launch(d, seed, seconds),
        "cleanrl_ppo": lambda d, seed: cleanrl_launch(d, seed, seconds,
                                                      windows=ROLLING_WINDOWS,
                                                      report_interval_s=ROW_INTERVAL_S),
    }
    result = target_case(args, workdir, systems, f"CartPole-v1 to {TARGET_RETURN:g}",
                         ("fps", "time_to_target_s"), seconds)
    return {**result, "row_interval_s": ROW_INTERVAL_S,
            "srl_jax_config": srl_jax_config("cartpole_ppo", CARTPOLE_OVERRIDES)}


DQN_OVERRIDES = ("replay.initial_priority=max",)
"""The baseline gives new transitions the largest priority seen: srl_jax too, for the
same algorithm on both sides (the config's Ape-X actor priorities are its own row)."""


def case_dqn(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    key, seconds = "eval_return_mean", budget(args, "dqn")
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch("cartpole_dqn", d,
                                                  (f"seed={seed}", *DQN_OVERRIDES), seconds,
                                                  key),
        "cleanrl_dqn": lambda d, seed: cleanrl_launch(d, seed, seconds, "cleanrl_dqn", key),
    }
    result = target_case(args, workdir, systems,
                         f"CartPole-v1 DQN to an evaluation return of {TARGET_RETURN:g}",
                         ("fps", "time_to_target_s", "frames_to_target"), seconds)
    return {**result, "return_key": key,
            "srl_jax_config": srl_jax_config("cartpole_dqn", DQN_OVERRIDES)}


def case_sampling(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """srl_jax sized for sampling (SAMPLING_SIZES), at the default experiment's sizes, and
    Sample Factory at its documented CartPole settings, against raw stepping. The
    efficiency is the first's; the ratio to Sample Factory is the second's (both
    systems at the sizes they train CartPole with)."""
    seconds = args.sampling_seconds
    sized = (*SAMPLING_OVERRIDES, *SAMPLING_SIZES)
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch("cartpole_ppo", d, (f"seed={seed}", *sized),
                                                  seconds),
        "srl_jax_default_sizes": lambda d, seed: srl_jax_launch(
            "cartpole_ppo", d, (f"seed={seed}", *SAMPLING_OVERRIDES), seconds),
        "sample_factory": lambda d, seed: sample_factory_launch(d, seed, seconds,
                                                                sampling_only=True),
    }
    runs = rounds_of(systems, args, workdir, seconds + 60, None)
    print(f"  raw env stepping: {nproc()} processes x 16 CartPoles ...", flush=True)
    raw = raw_rate_on_all_cores({"id": "CartPole-v1"}, 16, args.raw_seconds)
    summary = system_summaries(runs)

    def efficiency(name: str) -> float | None:
        return summary[name]["fps"]["median"] / raw if summary[name]["fps"] else None

    ratios = spread(ratio_rounds(runs, "srl_jax_default_sizes", "sample_factory", "fps"))
    result = {"seconds": seconds, "rounds": args.rounds, "raw_env_steps_per_s": raw,
              "srl_jax_config": srl_jax_config("cartpole_ppo", sized),
              "srl_jax_default_sizes_config": srl_jax_config("cartpole_ppo",
                                                             SAMPLING_OVERRIDES),
              "systems": summary, "sampling_efficiency": efficiency("srl_jax"),
              "sampling_efficiency_default_sizes": efficiency("srl_jax_default_sizes"),
              "sampling_efficiency_sample_factory": efficiency("sample_factory"),
              "fps_ratio_vs_sample_factory": ratios["median"] if ratios else None,
              "ratios": {"fps_ratio_vs_sample_factory": ratios}}
    rows = [(name, cell(s["fps"], ",.0f"),
             "-" if efficiency(name) is None else f"{efficiency(name):.2f}")
            for name, s in summary.items()]
    rows.append((f"raw env stepping ({nproc()} procs)", f"{raw:,.0f}", "1.00"))
    print_table(f"CartPole-v1 sampling, learning negligible, {seconds:g}s runs",
                rows, ("system", "env frames/s", "/ raw"))
    print(f"srl_jax (default sizes) / sample_factory fps: {cell(ratios, '.2f')}")
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
    rows = [("srl_jax (Nature-CNN, remote inference)", cell(ours, ",.0f"),
             f"{ours['median'] / raw:.2f}" if ours else "-"),
            (f"raw ALE stepping ({nproc()} procs)", f"{raw:,.0f}", "1.00")]
    print_table(f"ALE Pong-v5 sampling (agent steps/s; 4 emulator frames each), {seconds:g}s runs",
                rows, ("system", "steps/s", "/ raw"))
    return result


EQUAL_FRAMES_OVERRIDES = ("stop.target_return=null",)
"""srl_jax runs on to the case's frames, where the harness stops it."""
EQUAL_FRAMES_RATIOS = ("fps", "time_to_frames_s")
"""The figures of a run to equal frames that have an srl_jax / peer ratio, besides the
final ones (`final_<key>`)."""


def baseline_schedule(experiment: str, frames: int) -> tuple[str, ...]:
    """The baseline's step-size options, as srl_jax's config anneals it: linearly over its
    `stop.env_frames` (the runs stop at `frames`, part way), or not at all."""
    config = load_config(REPO_ROOT / "configs" / f"{experiment}.yaml")
    if config.stop.env_frames and frames > config.stop.env_frames:
        raise SystemExit(f"{frames:,} frames: {experiment} stops at its stop.env_frames "
                         f"({config.stop.env_frames:,})")
    if algorithm_config(config).anneal_lr:
        return ("--total-frames", str(config.stop.env_frames))
    return ("--no-anneal-lr",)


def equal_frames_case(args: argparse.Namespace, workdir: Path, case: str, experiment: str,
                      baseline: str, frames: int, final_keys: tuple[str, ...],
                      title: str) -> dict[str, Any]:
    """Rounds of srl_jax's `experiment` and the single-process `baseline` to `frames` env
    steps (or the case's budget): each side's fps, start-up, time to the frames and
    `final_keys` there, and srl_jax / baseline ratios of them round by round."""
    seconds, schedule = budget(args, case), baseline_schedule(experiment, frames)
    systems = {
        "srl_jax": lambda d, seed: srl_jax_launch(
            experiment, d, (f"seed={seed}", *EQUAL_FRAMES_OVERRIDES), seconds, frames=frames,
            final_keys=final_keys),
        baseline: lambda d, seed: cleanrl_launch(
            d, seed, seconds, baseline, target=None, frames=frames, final_keys=final_keys,
            extra=schedule),
    }
    runs = rounds_of(systems, args, workdir, seconds, None)
    finals = tuple(f"final_{key}" for key in final_keys)
    summary = {name: {**{figure: spread([r.figure(figure) for r in results]) for figure in
                         ("fps", "startup_s", "time_to_frames_s", "frames", *finals)},
                      "reached": sum(r.time_to_frames_s is not None for r in results),
                      "runs": [r.as_dict() for r in results]}
               for name, results in runs.items()}
    ratios = {f"{figure.removesuffix('_s')}_ratio_vs_{baseline}":
              spread(ratio_rounds(runs, "srl_jax", baseline, figure))
              for figure in (*EQUAL_FRAMES_RATIOS, *finals)}
    print_equal_frames(title, frames, args.rounds, summary, finals, ratios)
    return {"frames": frames, "rounds": args.rounds, "budget_s": seconds,
            "final_keys": list(final_keys), "baseline": baseline,
            "baseline_options": list(schedule),
            "srl_jax_config": srl_jax_config(experiment, EQUAL_FRAMES_OVERRIDES),
            "systems": summary, "ratios": ratios,
            **{key: value["median"] if value else None for key, value in ratios.items()}}


def print_equal_frames(title: str, frames: int, rounds: int, summary: dict[str, Any],
                       finals: tuple[str, ...], ratios: dict[str, Any]) -> None:
    rows = [(name, cell(s["fps"], ",.0f"), cell(s["startup_s"], ".1f"),
             cell(s["time_to_frames_s"], ".1f"), *(cell(s[f], ".3f") for f in finals),
             f"{s['reached']}/{rounds}") for name, s in summary.items()]
    print_table(f"{title} to {frames:,} env steps: median [min-max] over {rounds} rounds", rows,
                ("system", "env frames/s", "start-up s", "time to the frames s",
                 *(f.removeprefix("final_") for f in finals), "reached"))
    print_table("srl_jax / peer, round by round",
                [(key, cell(value, ".2f")) for key, value in ratios.items()],
                ("ratio", "median [min-max]"))


def needs(*modules: str) -> bool:
    """Whether the modules a case's systems import are installed (else it says so)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"  skipped: needs {', '.join(missing)} (the [minatar] and [jaxmarl] extras)")
    return not missing


def case_minatar(args: argparse.Namespace, workdir: Path) -> dict[str, Any] | None:
    if not needs("minatar", "gymnax"):
        return None
    return equal_frames_case(args, workdir, "minatar", "minatar_breakout_ppo", "purejaxrl_ppo",
                             args.minatar_frames, ("episode_return_mean_last100",),
                             "MinAtar Breakout PPO")


def case_smax(args: argparse.Namespace, workdir: Path) -> dict[str, Any] | None:
    if not needs("jaxmarl"):
        return None
    return equal_frames_case(args, workdir, "smax", "smax_3m_mappo", "jaxmarl_mappo",
                             args.smax_frames, ("win_rate_last100", "episode_return_mean_last100"),
                             "SMAX 3m MAPPO")


BUDGETS_S = {"cartpole": 180.0, "dqn": 300.0, "minatar": 900.0, "smax": 1200.0}
"""Default --budget per case: the issue's bounds for MinAtar (15 minutes) and SMAX (20)."""
CASES = {"cartpole": case_cartpole, "dqn": case_dqn, "sampling": case_sampling,
         "pong": case_pong, "minatar": case_minatar, "smax": case_smax}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.compare",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--rounds", type=int, default=3, help="A B C rounds (at least 3)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds a run of cartpole, dqn (to 475), minatar or smax (to "
                             "its frames) may take (default: 180, 300, 900 and 1200)")
    parser.add_argument("--minatar-frames", type=int, default=3_000_000,
                        help="env frames of the minatar case's runs")
    parser.add_argument("--smax-frames", type=int, default=1_000_000,
                        help="env steps of the smax case's runs")
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
