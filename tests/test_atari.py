"""Atari: the preprocessing against a frame-by-frame reference on the raw ALE, life-loss
handling, and both Atari configs streaming uint8 frames end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import gymnasium as gym
import numpy as np
import pytest

from actors.env_families.atari import register_atari
from actors.env_ring import EnvSplit
from actors.envs import env_spec, make_env
from srl_jax.config.loader import load_config
from srl_jax.config.schema import EnvConfig
from srl_jax.dataflow.chunk_spec import run_chunk_layout
from srl_jax.runtime.run_dir import read_status
from tests.conftest import REPO, Processes, stop_when

SIZE = 84


def atari_config(game: str, **atari: object) -> EnvConfig:
    config = EnvConfig(id=f"ALE/{game}-v5")
    for key, value in {"sticky_actions": 0.0, **atari}.items():
        setattr(config.atari, key, value)
    return config


def raw_env(game: str, seed: int) -> gym.Env:
    register_atari(game)
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
    env.reset(seed=seed)
    return env


def skip(env: gym.Env, action: int, frames: int = 4) -> tuple[np.ndarray, float]:
    """The reference frame skip: repeat, sum rewards, max over the last two frames,
    84x84 grayscale by area interpolation."""
    ale, total, screens = env.unwrapped.ale, 0.0, []
    for _ in range(frames):
        _, reward, *_ = env.step(action)
        total += reward
        screens.append(ale.getScreenGrayscale())
    pooled = np.maximum(screens[-2], screens[-1])
    return cv2.resize(pooled, (SIZE, SIZE), interpolation=cv2.INTER_AREA), total


def test_frames_match_the_reference_max_pool_and_stack() -> None:
    env = make_env(atari_config("Pong", noop_max=0))
    obs, _ = env.reset(seed=3)
    reference = raw_env("Pong", seed=3)
    for action in (1, 2):  # FireReset
        first, _ = skip(reference, action)
    assert obs.shape == (SIZE, SIZE, 4) and obs.dtype == np.uint8
    assert all(np.array_equal(obs[..., k], first) for k in range(4)), "stack padded by reset"
    rng = np.random.default_rng(0)
    frames = [first] * 4
    for _ in range(60):
        action = int(rng.integers(env.action_space.n))
        obs, reward, *_ = env.step(action)
        expected, expected_reward = skip(reference, action)
        frames = [*frames[1:], expected]
        assert reward == expected_reward
        np.testing.assert_array_equal(obs, np.stack(frames, axis=-1))
    assert len({obs[..., k].tobytes() for k in range(4)}) > 1, "the frames should move"


def noops_taken(seed: int) -> int:
    """How many no-ops a noop_max=30 reset made: the k whose reference start matches."""
    obs, _ = make_env(atari_config("Pong", noop_max=30)).reset(seed=seed)
    for k in range(1, 31):
        reference = raw_env("Pong", seed)
        for _ in range(k):
            reference.step(0)
        for action in (1, 2):
            start, _ = skip(reference, action)
        if np.array_equal(obs[..., -1], start):
            return k
    raise AssertionError(f"seed {seed}: no reference start with 1..30 no-ops matches")


def test_noop_starts_are_random_and_within_the_limit() -> None:
    taken = [noops_taken(seed) for seed in range(4)]
    assert len(set(taken)) > 1, taken


def test_a_lost_life_ends_the_episode_for_learning_but_not_the_game() -> None:
    env = make_env(atari_config("Breakout", noop_max=0, episodic_life=True))
    split = EnvSplit([env], seeds=[7])
    ale = env.unwrapped.ale
    rng = np.random.default_rng(1)
    life_losses, raw_score, finished = 0, 0.0, []
    while not finished:
        lives_before = ale.lives()
        result = split.step([int(rng.integers(4))])
        raw_score += float(result.rewards[0])
        if result.terminated[0] and not result.episode_returns:
            life_losses += 1
            assert 0 < ale.lives() < lives_before, "terminated only where a life was lost"
            assert ale.getEpisodeFrameNumber() > 0, "the game goes on after a lost life"
        finished = result.episode_returns
    assert life_losses == 4, "five lives: four losses end a life, the fifth the game"
    assert finished == [raw_score], "the reported return is the whole game's raw score"
    assert ale.lives() == 5, "a new game after game over"


def test_atari_specs_are_uint8_frames_and_chunks_carry_them() -> None:
    for name in ("atari_breakout_ppo", "atari_pong_impala", "atari_pong_r2d2"):
        config = load_config(REPO / "configs" / f"{name}.yaml")
        spec = env_spec(config.env)
        assert spec.obs_shape == (SIZE, SIZE, 4) and spec.obs_dtype == np.uint8
        assert spec.frame_stack == 4, "replay stores each frame once"
        T, n = config.actors.trajectory_length, config.actors.envs // config.actors.splits
        assert run_chunk_layout(config, spec)["obs"] == ((T + 1, n, SIZE, SIZE, 4),
                                                     np.dtype(np.uint8))


SMALL = ["actors.count=1", "actors.envs=2", "actors.splits=1", "actors.trajectory_length=16",
         "inference.max_batch=4", "learner.batch_envs=2", "learner.sample_queue=8",
         "inference.min_padded_batch=2", "runtime.log_interval_s=0.5",
         "runtime.heartbeat_timeout_s=15"]
"""A short heartbeat timeout: compiling the Nature-CNN update on a CPU takes longer, and
the learner must heartbeat through it (Worker.busy) rather than be killed as frozen.
Requests of 2 rows are served as 2 (not padded to the default 8): the Nature-CNN's
forward pass on a CPU is most of the cost of the frames the test streams."""
SMALL_BY_ALGORITHM = {
    "atari_breakout_ppo": ["learner.ppo.epochs=1", "learner.ppo.minibatches=1"],
    "atari_pong_impala": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(SMALL_BY_ALGORITHM))
def test_atari_config_streams_frames_end_to_end(processes: Processes, tmp_path: Path,
                                                experiment: str) -> None:
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", experiment, "--run-dir", str(run_dir),
            "--quiet"]
    for override in SMALL + SMALL_BY_ALGORITHM[experiment]:
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    rows = stop_when(process, run_dir, lambda row: row["env_frames"] >= 1500
                     and row["learner_steps"] >= 1, 120, tmp_path / "launch.log")
    last = rows[-1]
    assert last["env_frames"] >= 1500 and last["learner_steps"] >= 1
    assert last["system/wire_rejected"] == 0, "every uint8 chunk fit the learner's layout"
    assert any(r.get("inference/batch_rows_mean", 0) > 0 for r in rows), "remote inference"
    workers = read_status(run_dir)["workers"]
    assert {w["kind"] for w in workers} == {"actor", "inference", "learner"}
    assert [w["restarts"] for w in workers] == [0, 0, 0], \
        "nobody was killed as frozen: " + (run_dir / "logs" / "controller.log").read_text()
