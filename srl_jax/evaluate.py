"""Evaluate a trained policy: `python -m srl_jax.evaluate RUN_DIR --episodes N`.

Loads the newest checkpoint of a run directory (or `--step`, or `--best`),
plays N episodes with the most likely action (or sampled ones with
`--stochastic`) and prints the mean return. With `--video` it also writes an
MP4 of the first episode, for environments that render rgb_array frames.
Exit code 2 with one line when there is nothing to evaluate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from srl_jax.config import is_pettingzoo
from srl_jax.worker import read_run_config

EXIT_USAGE = 2
VIDEO_FPS = 30


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m srl_jax.evaluate",
                                     description="Play episodes with a trained policy.")
    parser.add_argument("run_dir", type=Path, help="a run directory with checkpoints")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (10)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--best", action="store_true",
                        help="the checkpoint with the best training return")
    parser.add_argument("--stochastic", action="store_true",
                        help="sample actions instead of taking the most likely one")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode (0)")
    parser.add_argument("--video", nargs="?", type=Path, const=True, default=None,
                        metavar="PATH", help="write an MP4 of the first episode "
                        "(default path: RUN_DIR/videos/step-<step>.mp4)")
    return parser.parse_args(argv)


def write_video(path: Path, frames: list[np.ndarray]) -> None:
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise SystemExit("srl_jax.evaluate: --video needs imageio and imageio-ffmpeg: "
                         "pip install 'srl-jax[video]'") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(path, frames, fps=VIDEO_FPS, macro_block_size=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.episodes < 1:
        print("srl_jax.evaluate: '--episodes' must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    config = args.run_dir / "config.yaml"
    if config.is_file() and is_pettingzoo(env_id := read_run_config(args.run_dir).env.id):
        print(f"srl_jax.evaluate: '{env_id}' is a multi-agent environment; this command plays "
              "single-agent ones (learners.export.load_policy(run_dir, policy=NAME) loads a "
              "policy of it)", file=sys.stderr)
        return EXIT_USAGE
    from actors.envs import make_env
    from learners.export import load_policy, play_episode

    try:
        policy = load_policy(args.run_dir, step=args.step, best=args.best, seed=args.seed)
    except FileNotFoundError as error:
        print(f"srl_jax.evaluate: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        env = make_env(policy.config.env, render_mode="rgb_array" if args.video else None)
    except Exception as error:  # a renderer (e.g. pygame) that is not installed
        print(f"srl_jax.evaluate: cannot make '{policy.config.env.id}'"
              f"{' with rgb_array rendering' if args.video else ''}: {error}", file=sys.stderr)
        return EXIT_USAGE
    frames: list[np.ndarray] | None = [] if args.video else None
    returns, lengths = [], []
    print(f"{policy.config.env.id}: checkpoint step {policy.step} of {args.run_dir}", flush=True)
    for episode in range(args.episodes):
        episode_return, length = play_episode(policy, env, args.seed + episode,
                                              not args.stochastic,
                                              frames if episode == 0 else None)
        returns.append(episode_return)
        lengths.append(length)
        print(f"episode {episode + 1}/{args.episodes}: return {episode_return:.1f}, "
              f"length {length}", flush=True)
    env.close()
    if frames is not None:
        path = args.video if isinstance(args.video, Path) else \
            args.run_dir / "videos" / f"step-{policy.step}.mp4"
        write_video(path, frames)
        print(f"video of episode 1: {path}")
    print(f"mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {args.episodes} "
          f"episodes (mean length {np.mean(lengths):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
