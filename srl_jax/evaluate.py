"""Evaluate a trained policy: `python -m srl_jax.evaluate RUN_DIR --episodes N`.

Loads the newest checkpoint of a run directory (or `--step`, or `--best`), from
where the run wrote them (its `checkpoint.dir`) or from `--checkpoint-dir`,
plays N episodes with the most likely action (or sampled ones with
`--stochastic`) and prints the mean return. A multi-agent run's policies play
together in one env made once for all episodes; it prints each policy's own return
(the mean of its agents'), the team return (all agents' rewards summed) and, as
"return", the mean of every agent's own return (what `episode_return_mean` counts).
With `--video` it also writes an MP4 of the first episode, for environments that
render rgb_array frames.
Exit code 2 with one line when there is nothing to evaluate, when a path cannot be read
(or the video's directory made), or when the checkpoint is of another checkpoint format
than this srl_jax's (the line names both).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from srl_jax.config.env_families import family_of

if TYPE_CHECKING:
    from policy.export import TeamEpisode, TrainedPolicy

EXIT_USAGE = 2
VIDEO_FPS = 30


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m srl_jax.evaluate",
                                     description="Play episodes with a trained policy.")
    parser.add_argument("run_dir", type=Path, help="a run directory with checkpoints")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (10)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--checkpoint-dir", metavar="PATH_OR_URI",
                        help="where the run's checkpoints are, if not where its config says "
                        "(e.g. a copy of the learner host's directory, or gs://bucket/run)")
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
    # imageio's stub asks for a list[ArrayLike], which a list of arrays is not (invariance).
    imageio.mimwrite(path, frames, fps=VIDEO_FPS,  # type: ignore[arg-type]
                     macro_block_size=1)


def _make_player(team: list[TrainedPolicy], args: argparse.Namespace
                 ) -> Callable[..., TeamEpisode]:
    """play(seed, frames) -> the episode's returns and length, in the team's environment
    (made here once, closed at exit); ValueError when the env cannot be made."""
    from actors.envs import make_env, make_team_split
    from policy.export import TeamEpisode, play_episode, play_team_episode

    config, deterministic = team[0].config.env, not args.stochastic
    render_mode = "rgb_array" if args.video else None
    try:
        if family_of(config).multi_agent:
            kwargs = dict(config.kwargs, render_mode=render_mode) if render_mode else config.kwargs
            config = dataclasses.replace(config, kwargs=kwargs)
            split = make_team_split(config, args.seed)  # renderer included
            atexit.register(split.close)
            return lambda seed, frames: play_team_episode(team, split, seed, deterministic,
                                                          frames)
        env = make_env(config, render_mode=render_mode)
    except Exception as error:  # a renderer (e.g. pygame) that is not installed
        raise ValueError(f"cannot make '{config.id}'"
                         f"{' with rgb_array rendering' if args.video else ''}: {error}") from None
    atexit.register(env.close)

    def play(seed: int, frames: list[np.ndarray] | None) -> TeamEpisode:
        episode_return, length = play_episode(team[0], env, seed, deterministic, frames)
        return TeamEpisode({}, episode_return, episode_return, length)

    return play


def _spread(values: list[float]) -> str:
    return f"{np.mean(values):.2f} +- {np.std(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.episodes < 1:
        print("srl_jax.evaluate: '--episodes' must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    from policy.export import load_team, use_run_compilation_cache

    try:
        use_run_compilation_cache(args.run_dir)
        policies = load_team(args.run_dir, step=args.step, best=args.best, seed=args.seed,
                             checkpoint_dir=args.checkpoint_dir)
        team = list(policies.values())
        play = _make_player(team, args)
        video = args.video if isinstance(args.video, Path) else \
            args.run_dir / "videos" / f"step-{team[0].step}.mp4"
        if args.video:  # where it goes made before the episodes are played
            video.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as error:
        reason = f"{error.filename}: {error.strerror}" \
            if isinstance(error, OSError) and error.strerror and error.filename else error
        print(f"srl_jax.evaluate: {reason}", file=sys.stderr)
        return EXIT_USAGE
    steps = ", ".join(f"{name} {policy.step}" for name, policy in policies.items()) \
        if len(policies) > 1 else str(team[0].step)
    print(f"{team[0].config.env.id}: checkpoint step {steps} of {args.run_dir}", flush=True)
    frames: list[np.ndarray] | None = [] if args.video else None
    episodes = []
    for episode in range(args.episodes):
        played = play(args.seed + episode, frames if episode == 0 else None)
        episodes.append(played)
        own = "; ".join([*(f"{name} {value:.1f}" for name, value in played.returns.items()),
                         f"team {played.team_return:.1f}"]) if played.returns else ""
        print(f"episode {episode + 1}/{args.episodes}: return {played.agent_mean:.1f}"
              f"{f' ({own})' if own else ''}, length {played.length}", flush=True)
    if frames is not None:
        write_video(video, frames)
        print(f"video of episode 1: {video}")
    print(f"mean return {_spread([e.agent_mean for e in episodes])} over {args.episodes} "
          f"episodes (mean length {np.mean([e.length for e in episodes]):.1f})")
    if episodes[0].returns:  # a multi-agent run: "return" is the mean of every agent's own
        for name in episodes[0].returns:
            print(f"policy {name}: mean return {_spread([e.returns[name] for e in episodes])}"
                  " (the mean of its agents' own returns)")
        print(f"team: mean return {_spread([e.team_return for e in episodes])} "
              "(all agents' rewards summed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
