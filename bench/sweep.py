"""A learning-rate sweep of the default experiment in one run: the README's sweep table
and figure.

It runs ``python -m srl_jax.launch cartpole_ppo --sweep learner.ppo.learning_rate=...``
(one population member per value, side by side on this machine, each ending when every
member reaches 475 or at ``--seconds``), loads the run with
``srl_jax.analysis.load_population``, ranks the values with ``analysis.compare`` and
writes ``bench/results/sweep.json`` and the figure ``docs/figures/sweep_learning_rate.png``
(each member's return against its own frames). ``python -m bench.report`` puts the table in
the README.

    .venv/bin/python -m bench.sweep
    .venv/bin/python -m bench.sweep --rates 1e-4 1e-3 --seconds 120
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from bench.harness.launcher import STOP_GRACE_S, run_launcher
from bench.harness.machine import REPO_ROOT, config_hash, write_results
from srl_jax import analysis

KEY = "learner.ppo.learning_rate"
FIGURE = REPO_ROOT / "docs" / "figures" / "sweep_learning_rate.png"
TARGET = 475.0
START_MARGIN_S = 120.0


def _number(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", type=float, default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--seconds", type=float, default=180.0, help="wall-time limit")
    args = parser.parse_args(argv)
    sweep = f"{KEY}={','.join(f'{rate:g}' for rate in args.rates)}"
    with tempfile.TemporaryDirectory(prefix="srl_jax_sweep_") as scratch:
        run_dir = Path(scratch) / "run"
        command = [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--run-dir",
                   str(run_dir), "--quiet", "--sweep", sweep,
                   "--set", f"stop.wall_time_s={args.seconds:g}"]
        code = run_launcher(command, run_dir, Path(scratch) / "launch.log",
                            args.seconds + START_MARGIN_S + STOP_GRACE_S)
        if code != 0:
            print((Path(scratch) / "launch.log").read_text(), file=sys.stderr)
            return 1
        df = analysis.load_population(run_dir)
        ranked = analysis.compare(df, KEY, target=TARGET)
        ax = analysis.plot_curves(df, x="env_frames", by=KEY, band=None)
        ax.set_title(f"cartpole_ppo --sweep {sweep}")
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        ax.figure.savefig(FIGURE, dpi=80)
        wall = float(df["time"].max())
    print(ranked.to_string())
    rows = [{"value": float(value), "final_return": _number(row["final_mean"]),
             "frames_to_target": _number(row["frames_to_target"]),
             "time_to_target_s": _number(row["time_to_target"])}
            for value, row in ranked.iterrows()]
    path = write_results("sweep", {"command": f"./run.sh cartpole_ppo --sweep {sweep}",
                                   "config_sha256": config_hash("cartpole_ppo"),
                                   "key": KEY, "target_return": TARGET, "wall_s": wall,
                                   "members": rows})
    print(f"results: {path}\nfigure: {FIGURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
