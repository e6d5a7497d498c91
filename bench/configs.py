"""What each shipped config reaches, in what time, on this machine: the README's
"Experiments" table.

For every config in ``configs/`` (or those named) it

1. runs ``python -m srl_jax.launch <config>`` as shipped ``--runs`` times, each
   in a fresh run directory; a config with no wall-time limit, or one longer
   than ``--max-minutes``, gets ``stop.wall_time_s`` = ``--max-minutes`` (the
   Atari configs train for 50M frames, far past what a CPU does in minutes); with
   ``--seeds`` run k takes the config's seed + k, each run's ``seed`` is recorded;
2. reads each run's ``metrics.jsonl`` (``srl_jax.analysis``): the first return
   (mean of the first 3 rows with one), the final return (mean of the last 10),
   the best row, the time and frames at the end and to the config's
   ``stop.target_return`` (or to its evaluator's ``stop.target_eval_return``), and
   why the run stopped;
3. plays the same environment with uniform random actions through the split an
   actor steps (``actors.envs.make_split``), so episodes are counted as
   in training: whole Atari games with their raw score, the mean of every agent's
   own return in a multi-agent env (its `episode_return_mean`). That is the floor a
   config must rise above.

With ``--hold N`` a run is launched without its target stop (keeping its wall-time
limit) and stopped by the bench (SIGINT to the launcher, by its pid) once N more rows
with the target's metric followed the first that reached it: whether the return holds
there or was one lucky row. The run's ``held`` records those N values.

Results merge into ``bench/results/configs.json`` (or ``--out``) one config at a time (each
entry with its own date and machine), so configs can be measured separately;
``python -m bench.report`` writes the README table from that file. Run it alone on the
machine: the figures are wall-clock times.

    .venv/bin/python -m bench.configs                                   # all configs
    .venv/bin/python -m bench.configs cartpole_ppo pendulum_ppo --runs 3
    .venv/bin/python -m bench.configs atari_pong_impala --max-minutes 15
    .venv/bin/python -m bench.configs mpe_spread_ppo mpe_spread_mappo --runs 3 --interleave --seeds
    .venv/bin/python -m bench.configs cartpole_dqn --runs 3 --seeds --hold 5
    .venv/bin/python -m bench.configs atari_breakout_ppo --figure    # its curve, as a PNG

Every process this script starts is stopped by its pid on Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from actors.envs import env_seed, env_spec, make_split
from bench.harness.launcher import (
    STOP_GRACE_S,
    BenchError,
    in_workdir,
    raise_on_sigterm,
    run_launcher,
)
from bench.harness.machine import (
    CONFIGS_DIR,
    REPO_ROOT,
    RESULTS_DIR,
    config_hash,
    describe,
    git_commit,
    write_results,
)
from srl_jax.analysis import RETURN, load_run, summarize
from srl_jax.config.env_families import extras_of, family_of
from srl_jax.config.loader import load_config
from srl_jax.config.schema import EnvConfig, ExperimentConfig, policy_names
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.metrics_table import agent_mean_returns
from srl_jax.runtime.run_dir import read_metrics
from srl_jax.runtime.supervisor import EXIT_INTERRUPTED

FIGURES_DIR = REPO_ROOT / "docs" / "figures"
EVAL_RETURN = "eval_return_mean"
"""What a config with `stop.target_eval_return` is measured by: its evaluator's return."""
RESULTS_NAME = "configs"
FIRST_ROWS = 3
LAST_ROWS = 10
RANDOM_ENVS = 8
CURVE_POINTS = 200
"""Rows of each run's return curve kept in the results (evenly spaced)."""
FINAL_METRICS = ("win_rate", EVAL_RETURN, "team_return_mean")
"""Metrics besides the target's whose final (the mean of the last LAST_ROWS rows that have
one) each run records as `final_<metric>`: what bench.report.published reads."""
START_MARGIN_S = 300.0
"""Allowed on top of a run's wall-time limit (start-up, final save, shutdown)."""


# ----------------------------------------------------------------- training


def shipped(name: str) -> ExperimentConfig:
    return load_config(CONFIGS_DIR / f"{name}.yaml")


@dataclass(frozen=True)
class Target:
    """The return a config's runs are measured by: the metric its target stop reads."""

    metric: str
    value: float


def target_of(config: ExperimentConfig) -> Target | None:
    """The evaluator's target when the config sets one, else the training return's."""
    if config.stop.target_eval_return is not None:
        return Target(EVAL_RETURN, config.stop.target_eval_return)
    if config.stop.target_return is not None:
        return Target(RETURN, config.stop.target_return)
    return None


def held_values(rows: list[dict[str, Any]], metric: str, target: float,
                n: int) -> list[float] | None:
    """`metric` of the first `n` rows that have it after the first row where it reached
    `target` (fewer while the run has not written them); None when no row reached it."""
    values = [float(row[metric]) for row in rows if _number(row.get(metric)) is not None]
    first = next((k for k, value in enumerate(values) if value >= target), None)
    return None if first is None else values[first + 1:first + 1 + n]


def run_config(name: str, max_s: float, run_dir: Path, seed: int | None = None,
               hold: int = 0) -> tuple[int, list[str], bool]:
    """One run of config `name` as shipped (with `seed`: that seed), capped at `max_s`;
    with `hold`: without its target stop, stopped by SIGINT `hold` rows after the target.
    (Exit code, the overrides every run of it gets, whether the bench
    stopped it there.)"""
    config = shipped(name)
    stop, target = config.stop, target_of(config)
    overrides = []
    if not stop.wall_time_s or stop.wall_time_s > max_s:
        overrides = [f"stop.wall_time_s={max_s:g}"]
    if hold and target is not None:  # both, should a config set both
        overrides += [f"stop.{key}=null" for key in ("target_return", "target_eval_return")
                      if getattr(stop, key) is not None]
    command = [sys.executable, "-m", "srl_jax.launch", name, "--run-dir", str(run_dir), "--quiet"]
    for override in [*overrides, *([f"seed={seed}"] if seed is not None else [])]:
        command += ["--set", override]
    limit = min(stop.wall_time_s or max_s, max_s) + START_MARGIN_S + STOP_GRACE_S
    log_path = run_dir.parent / f"{run_dir.name}.log"
    if not (hold and target is not None):
        return run_launcher(command, run_dir, log_path, limit), overrides, False
    held: list[bool] = []

    def has_held() -> bool:  # the bench stops it `hold` rows after the target
        values = held_values(read_metrics(run_dir), target.metric, target.value, hold)
        held.append(values is not None and len(values) >= hold)
        return held[-1]

    code = run_launcher(command, run_dir, log_path, limit, stop_when=has_held)
    return code, overrides, bool(held) and held[-1]


def _number(value: Any) -> float | None:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return None if missing else float(value)


def run_figures(run_dir: Path, target: Target | None, hold: int = 0) -> dict[str, Any]:
    """The figures of one finished run of a config with `target` (see the module
    docstring); with `hold`, `held`: the `hold` values after its first reach (None when
    it never reached the target)."""
    df = load_run(run_dir).sort_values("time", kind="stable")
    returns = df[RETURN].dropna()
    if returns.empty:
        raise BenchError(f"{run_dir}: no episode returns were recorded")
    summary = summarize(df, last=LAST_ROWS)
    if target is not None:  # the config's own: a --hold run was launched without it
        to_target = summarize(df, target=target.value, metric=target.metric)
        summary = {**summary, **{k: to_target[k] for k in (
            "target", "time_to_target", "frames_to_target")}}
    held: dict[str, Any] | None = None
    if hold and target is not None and (values := held_values(
            read_metrics(run_dir), target.metric, target.value, hold)) is not None:
        held = {"after": hold, "values": values,
                "mean": statistics.fmean(values) if values else None,
                "min": min(values, default=None)}
    return {
        "target_metric": target.metric if target is not None else RETURN,
        "first_return": float(returns.head(FIRST_ROWS).mean()),
        "final_return": summary["final"],
        **{f"final_{metric}": _number(summarize(df, metric=metric, last=LAST_ROWS)["final"])
           for metric in FINAL_METRICS if metric in df},
        "max_return": summary["max"],
        "time_s": summary["time"],
        "env_frames": int(summary["env_frames"]),
        "learner_steps": int(summary["learner_steps"]),
        "fps_median": _number(summary["fps_median"]),
        "target": _number(summary["target"]),
        "time_to_target_s": _number(summary["time_to_target"]),
        "frames_to_target": _number(summary["frames_to_target"]),
        "stop_reason": summary["stop_reason"],
        "restarts": summary["restarts"],
        "curve": curve(df),
        **({"held": held} if hold else {}),
    }


def curve(df: pd.DataFrame) -> list[list[float]]:
    """[time s, env frames, return] of up to CURVE_POINTS rows with a return, evenly
    spaced, the last included: what `--figure` draws."""
    rows = df.dropna(subset=[RETURN])
    picked = np.unique(np.linspace(0, len(rows) - 1, min(len(rows), CURVE_POINTS)).astype(int))
    return [[round(float(r["time"]), 1), int(r["env_frames"]), round(float(r[RETURN]), 3)]
            for _, r in rows.iloc[picked].iterrows()]


NAMES = {"muzero": "MuZero"}
"""How the table names an algorithm whose name is not its upper case."""


def describe_config(config: ExperimentConfig) -> dict[str, str]:
    """What a config trains and which extras it needs (bench.report puts it in the README)."""
    env, learner = config.env, config.learner
    multi_agent = family_of(env).multi_agent
    shown = env.id.partition(":")[2] if multi_agent else env.id  # the module of 'family:module'
    if env.scenario:  # the SMAX map, Overcooked layout or Hanabi table
        shown += f" {env.scenario}"
    what = f"{NAMES.get(learner.algorithm, learner.algorithm.upper())}, {shown}"
    if config.network.kind != "mlp":
        what += f", {config.network.kind}"
    if config.network.core != "none":
        what += f", {config.network.core} {config.network.core_size}"
    if env.mask_obs:
        what += f", observation entries {env.mask_obs} masked"
    if multi_agent:
        specs = [env_spec(env, policy) for policy in policy_names(env)]
        what += (f", {sum(spec.agents for spec in specs)} agents, {len(specs)} "
                 f"polic{'y' if len(specs) == 1 else 'ies'}")
        if config.selfplay.frozen:
            what += f" ({len(config.selfplay.frozen)} frozen)"
        if config.network.critic == "global":
            what += ", centralized critic"
    return {"what": what, "needs": ", ".join(f"[{e}]" for e in extras_of(env))}


# ------------------------------------------------------------------- random


def random_actions(spec: EnvSpec, rows: int, rng: np.random.Generator) -> list:
    """One uniformly random action per row, in the form a split's `step` takes."""
    if not spec.continuous:
        return rng.integers(spec.action_dim, size=rows).tolist()
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    return list(rng.uniform(low, high, size=(rows, spec.action_dim)).astype(np.float32))


def random_returns(env: EnvConfig, episodes: int, max_s: float, seed: int = 0) -> list[float]:
    """Returns of `episodes` episodes (fewer if `max_s` runs out) with random actions."""
    specs = [env_spec(env, policy) for policy in policy_names(env)]
    split = make_split(env, RANDOM_ENVS, [env_seed(seed, 0, k) for k in range(RANDOM_ENVS)])
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    deadline = time.monotonic() + max_s
    try:
        while len(returns) < episodes and time.monotonic() < deadline:
            actions = [random_actions(spec, len(obs), rng)
                       for spec, obs in zip(specs, split.obs, strict=True)]
            returns += agent_mean_returns(split.step(actions).episode_returns,
                                          sum(spec.agents for spec in specs))
    finally:
        split.close()
    return returns[:episodes]


# --------------------------------------------------------------------- main


def train_once(name: str, index: int, args: argparse.Namespace,
               workdir: Path) -> tuple[dict[str, Any], list[str]]:
    """Run `index` of config `name`: (its figures, the overrides it ran with)."""
    run_dir = workdir / f"{name}-{index}"
    started = time.monotonic()
    config = shipped(name)
    target = target_of(config)
    seed = config.seed + (index if args.seeds else 0)
    code, overrides, stopped = run_config(name, args.max_minutes * 60, run_dir,
                                          seed if args.seeds else None, args.hold)
    if code != (EXIT_INTERRUPTED if stopped else 0):
        raise BenchError(f"the run exited with {code} (log: {run_dir}.log)")
    figures = {**run_figures(run_dir, target, args.hold), "seed": seed}
    if stopped and target is not None:
        figures["stop_reason"] = (f"stopped by bench.configs {args.hold} rows of "
                                  f"{target.metric} after its target {target.value:g}")
    print(f"{name} run {index}: return {figures['first_return']:.1f} -> "
          f"{figures['final_return']:.1f} (best {figures['max_return']:.1f}) in "
          f"{figures['time_s']:.0f}s, {figures['env_frames']:,} frames "
          f"({figures['stop_reason']}; {time.monotonic() - started:.0f}s with start-up)",
          flush=True)
    if held := figures.get("held"):
        print(f"{name} run {index}: the {held['after']} rows after its first reach at "
              f"{figures['time_to_target_s']:.0f}s: {held['values']}", flush=True)
    return figures, overrides


def results_entry(name: str, runs: list[dict[str, Any]], overrides: list[str],
                  measured_at: tuple[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Config `name`'s results entry from its runs, after playing it at random;
    `measured_at`: the commit and config hash its runs started from."""
    returns = random_returns(shipped(name).env, args.random_episodes, args.random_seconds)
    print(f"{name} random policy: {statistics.fmean(returns):.1f} over {len(returns)} episodes",
          flush=True)
    commit, config_sha256 = measured_at
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": commit,
        "config_sha256": config_sha256,
        "machine": describe(),
        "overrides": overrides,
        "hold": args.hold,
        "runs": runs,
        "random_return_mean": statistics.fmean(returns),
        "random_episodes": len(returns),
    }


def measure(names: list[str], args: argparse.Namespace,
            workdir: Path) -> dict[str, dict[str, Any]]:
    """Train each config `args.runs` times and play it at random: their results entries.
    Config after config; with `args.interleave`, run k of every config before run k+1 of
    any, so that a comparison's arms see the machine's load drift alike."""
    started = {name: (git_commit(), config_hash(name)) for name in names}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    overrides: dict[str, list[str]] = {}
    order = ([(index, name) for index in range(args.runs) for name in names] if args.interleave
             else [(index, name) for name in names for index in range(args.runs)])
    for index, name in order:
        figures, overrides[name] = train_once(name, index, args, workdir)
        runs[name].append(figures)
    return {name: results_entry(name, runs[name], overrides[name], started[name], args)
            for name in names}


def draw_figure(name: str, entry: dict[str, Any]) -> Path:
    """`docs/figures/<name>.png`: each run's return against wall-clock minutes, from its
    results entry, with the random policy's mean; what the README shows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for index, run in enumerate(entry["runs"]):
        points = np.asarray(run.get("curve") or [], float)
        if len(points):
            ax.plot(points[:, 0] / 60, points[:, 2], linewidth=1.5, label=f"run {index}: "
                    f"{run['env_frames']:,} frames, {run['learner_steps']:,} updates")
    ax.axhline(entry["random_return_mean"], color="grey", linestyle="--",
               label=f"random policy ({entry['random_return_mean']:.1f})")
    machine = entry["machine"]
    ax.set(xlabel="minutes since the first row", ylabel="episode return (mean of recent)",
           title=f"{name} as shipped, {machine['cores']} cores ({machine['cpu']}), "
                 f"commit {entry.get('commit', '?')}")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.configs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", metavar="CONFIG",
                        help="config names (default: every file in configs/)")
    parser.add_argument("--runs", type=int, default=1, help="runs per config (default: 1)")
    parser.add_argument("--max-minutes", type=float, default=15.0,
                        help="wall-time cap of a run (default: 15)")
    parser.add_argument("--random-episodes", type=int, default=20,
                        help="episodes of the random policy (default: 20)")
    parser.add_argument("--random-seconds", type=float, default=120.0,
                        help="time cap of the random policy's episodes (default: 120)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--interleave", action="store_true",
                        help="run k of every named config before run k+1 of any (for a "
                             "comparison: the arms see the machine's load alike)")
    parser.add_argument("--seeds", action="store_true",
                        help="run k with the config's seed + k: the runs then sample the "
                             "seeds' spread, not only the machine's (runs of one seed can "
                             "agree to 0.1 and still say little of another)")
    parser.add_argument("--hold", type=int, default=0, metavar="N",
                        help="run past the config's target and stop N rows of its metric "
                             "after the first that reached it; each run records them as "
                             "`held` (default: 0, stop at the target as shipped)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / f"{RESULTS_NAME}.json",
                        help="the results file to merge into (default: "
                             "bench/results/configs.json)")
    parser.add_argument("--figure", action="store_true",
                        help="run nothing: draw docs/figures/<config>.png of each named "
                             "config from its curves in the results file")
    args = parser.parse_args(argv)
    known = sorted(path.stem for path in CONFIGS_DIR.glob("*.yaml"))
    args.configs = args.configs or known
    for name in args.configs:
        if name not in known:
            parser.error(f"unknown config {name!r}; known: {', '.join(known)}")
    if args.runs < 1 or args.max_minutes <= 0 or args.random_episodes < 1:
        parser.error("--runs, --max-minutes and --random-episodes must be positive")
    if args.hold < 0:
        parser.error("--hold must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    path = args.out
    entries = json.loads(path.read_text())["configs"] if path.exists() else {}
    if args.figure:
        missing = [name for name in args.configs if not entries.get(name, {}).get("runs")]
        if missing:
            print(f"no results to draw for {', '.join(missing)}: measure them first",
                  file=sys.stderr)
            return 1
        for name in args.configs:
            print(f"wrote {draw_figure(name, entries[name])}")
        return 0

    def measure_all(workdir: Path) -> int:
        failed = False
        groups = [args.configs] if args.interleave else [[name] for name in args.configs]
        for names in groups:
            try:
                entries.update(measure(names, args, workdir))
            except BenchError as error:
                print(f"{', '.join(names)}: {error}", flush=True)
                failed = True
                continue
            written = write_results(path.stem, {"configs": dict(sorted(entries.items()))},
                                    path.parent)
            print(f"results: {written}", flush=True)
        return 1 if failed else 0

    return in_workdir("srl_configs_", args.keep, measure_all)


if __name__ == "__main__":
    sys.exit(main())
