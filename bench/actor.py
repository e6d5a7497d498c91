"""Actor throughput against the env ring's size and splits: frames/s per actor.

For each experiment and each (envs K, splits S) pair it runs the real system
(launcher, one actor, one inference server, the learner) for `--seconds`, with
the actor's samples dropped rather than waiting when the learner is behind
(`actors.send_policy=drop`), so the figure is the actor's sampling rate through
remote inference, not the learner's training rate. Each batch is one split
(`learner.batch_envs` = K/S), so any (K, S) makes a valid config.

Printed per pair, over the steady rows (start-up excluded, as in
`bench.e2e_fps`): frames/s of the one actor, and where its time goes
(`env`: stepping envs, `wait`: waiting for actions, `send`: pushing samples),
and the inference batch size. Cases: `cartpole` (cartpole_ppo) and `pong`
(atari_pong_impala; needs the [atari] extra).

    .venv/bin/python -m bench.actor                       # both, the default grids
    .venv/bin/python -m bench.actor --cases cartpole --seconds 15
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.harness.launcher import BenchError, run_experiment
from bench.harness.run_rows import read_rows, steady_figures
from srl_jax.config.schema import ActorConfig, request_rows

GRIDS = {
    "cartpole": ("cartpole_ppo", [(8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (32, 2), (32, 4),
                                  (64, 2), (64, 4)]),
    "pong": ("atari_pong_impala", [(4, 1), (4, 2), (8, 2), (16, 2), (16, 4)]),
}


def pair_overrides(envs: int, splits: int) -> list[str]:
    split = envs // splits
    return ["actors.count=1", f"actors.envs={envs}", f"actors.splits={splits}",
            "actors.send_policy=drop",
            f"inference.max_batch={request_rows(ActorConfig(envs=envs, splits=splits))}",
            f"learner.batch_envs={split}", "learner.sample_queue=8",
            "checkpoint.enabled=false"]


def measure(experiment: str, envs: int, splits: int, seconds: float,
            extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        run_dir = Path(root) / "run"
        args = argparse.Namespace(experiment=experiment, seconds=seconds,
                                  overrides=pair_overrides(envs, splits) + extra)
        code = run_experiment(args, run_dir, Path(root) / "launch.log")
        if code != 0:
            raise BenchError(f"{experiment} K={envs} S={splits}: launcher exited {code}: "
                             f"{(Path(root) / 'launch.log').read_text()[-500:]}")
        result = steady_figures(0, read_rows(run_dir / "metrics.jsonl"))
    return {"fps": result.fps, **result.splits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(GRIDS), default=sorted(GRIDS))
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="wall time of each run, start-up included (default: 20)")
    parser.add_argument("--pairs", nargs="+", metavar="K,S",
                        help="only these (envs, splits) pairs, e.g. 64,2 16,2")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="extra override for every run, e.g. "
                        "env.backend=envpool; repeatable")
    args = parser.parse_args(argv)
    print(f"{'case':9} {'K':>3} {'S':>2} {'fps/actor':>10} {'env':>5} {'wait':>5} {'send':>5} "
          f"{'batch':>6}", flush=True)
    for case in args.cases:
        experiment, grid = GRIDS[case]
        if args.pairs:
            grid = [tuple(int(x) for x in pair.split(",")) for pair in args.pairs]
        for envs, splits in grid:
            try:
                f = measure(experiment, envs, splits, args.seconds, args.overrides)
            except BenchError as error:
                print(f"{case:9} {envs:>3} {splits:>2} failed: {error}", flush=True)
                continue
            print(f"{case:9} {envs:>3} {splits:>2} {f['fps']:>10.0f} {f['env']:>5.2f} "
                  f"{f['wait']:>5.2f} {f['send']:>5.2f} {f['batch']:>6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
