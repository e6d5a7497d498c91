"""EnvPool as the actor's env backend: the StepResult and chunk layout of the gymnasium
ring, the same values where the two must agree, whole-game returns with episodic life.
A CartPole run learns with it in tests/test_run.py (the IMPALA solve).

Where values agree and where they cannot: EnvPool draws random starts from its own
generator, so identically seeded envs start apart (CartPole's initial state,
MuJoCo's reset noise). From one state, the same actions must give the same rewards,
flags and observations: CartPole from EnvPool's start states copied into the
gymnasium envs, and HalfCheetah with no reset noise, whose resets then agree too
(for some 60 steps, past the 24 compared: then the rounding of two MuJoCo builds
grows, as a chaotic system makes it). Atari games share the layout only: EnvPool's own ALE build and
preprocessing (grayscale, reset no-ops and FIRE) give other frames, and the same
points a few steps apart.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from actors.env_families.envpool_split import EnvPoolSplit, check_envpool, envpool_task
from actors.env_ring import ChunkBuilder, EnvSplit
from actors.envs import env_spec, make_env, make_split
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.chunk_spec import run_chunk_layout
from tests.conftest import make_config

N = 4


def test_task_names_follow_gymnasium_ids() -> None:
    assert envpool_task("ALE/Pong-v5", atari=True) == "Pong-v5"
    assert envpool_task("HalfCheetah-v5") == "HalfCheetah-v5"


def test_cartpole_split_resets_at_once_and_keeps_truncated_final_obs() -> None:
    config = EnvConfig(id="CartPole-v1", kwargs={"max_episode_steps": 20}, backend="envpool")
    spec = env_spec(config)
    split = EnvPoolSplit(config, N, seed=2**32 - 1)  # as env_seed may give: beyond int32
    assert split.obs.shape == (N, *spec.obs_shape) and split.obs.dtype == spec.obs_dtype
    chunk = ChunkBuilder(8, split.obs, spec)
    chunks = []
    rng = np.random.default_rng(0)
    ends = truncations = 0
    trunc_values = np.empty(0, np.float32)
    for _ in range(120):
        action = rng.integers(2, size=N).astype(np.int32)
        finished = chunk.on_policy(action, np.zeros(N, np.float32), np.zeros(N, np.float32), 0,
                                   trunc_values, np.zeros((N, 0), np.float32))
        chunks += [finished] if finished is not None else []
        result = split.step(list(action))
        chunk.on_step(result)
        trunc_values = np.zeros(len(result.truncated_envs), np.float32)
        done = result.terminated | result.truncated
        # A finished env's next observation is already the new episode's first: CartPole
        # starts within +-0.05 on every coordinate.
        assert np.all(np.abs(result.next_obs[done]) <= 0.05)
        assert not (result.terminated & result.truncated).any()
        assert list(result.truncated_envs) == list(np.flatnonzero(result.truncated))
        assert result.final_obs.shape == (int(result.truncated.sum()), *spec.obs_shape)
        assert result.episode_returns == [float(n) for n in result.episode_lengths]
        assert len(result.episode_returns) == int(done.sum())
        assert all(n <= 20 for n in result.episode_lengths)
        ends += int(done.sum())
        truncations += int(result.truncated.sum())
    assert ends > 0 and truncations > 0
    # The chunks of the gymnasium ring, field for field.
    layout = run_chunk_layout(make_config(["actors.envs=4", "actors.splits=1",
                                       "actors.trajectory_length=8", "learner.batch_envs=4"]),
                          spec)
    assert chunks and all({k: (v.shape, v.dtype) for k, v in c.items()} == layout
                          for c in chunks)
    split.close()


def test_breakout_counts_whole_games_with_episodic_life() -> None:
    config = EnvConfig(id="ALE/Breakout-v5", backend="envpool")
    config.atari = dataclasses.replace(config.atari, episodic_life=True, sticky_actions=0.0)
    spec = env_spec(config)
    assert spec.obs_shape == (84, 84, 4) and spec.obs_dtype == np.uint8
    split = EnvPoolSplit(config, 1, seed=7, atari=True)
    rng = np.random.default_rng(1)
    raw, life_ends, games = 0.0, 0, []
    for _ in itertools.count():
        result = split.step([int(rng.integers(spec.action_dim))])
        assert result.next_obs.shape == (1, 84, 84, 4)
        raw += float(result.rewards[0])
        if result.terminated[0] and not result.episode_returns:
            life_ends += 1
        if result.episode_returns:
            games = result.episode_returns
            break
    assert life_ends == 4 and games == [raw]
    split.close()


def test_spaces_that_differ_from_the_gymnasium_env_are_refused() -> None:
    config = EnvConfig(id="CartPole-v1", backend="envpool")
    wrong = dataclasses.replace(env_spec(config), obs_shape=(5,))
    with pytest.raises(ConfigError, match=r"'env.backend': EnvPool's 'CartPole-v1' observes "
                                          r"float32\[4\] with 2 actions, where the gymnasium "
                                          r"env has float32\[5\] with 2"):
        check_envpool(config, wrong)


def test_atari_without_reset_noops_is_refused_not_crashed() -> None:
    """EnvPool's Atari with noop_max 0 kills its process (a segfault): refused before."""
    config = EnvConfig(id="ALE/Pong-v5", backend="envpool")
    config.atari = dataclasses.replace(config.atari, noop_max=0)
    with pytest.raises(ConfigError, match=r"^'env.atari.noop_max': EnvPool's Atari needs at "
                                          r"least 1 \(it makes up to noop_max reset no-ops\), "
                                          r"got 0$"):
        env_spec(config)


def _chunks(config: EnvConfig, steps: int, length: int) -> list[dict[str, np.ndarray]]:
    """The chunks an actor's ring builds from a split of `config` under random actions."""
    spec = env_spec(config)
    split = make_split(config, N, [11 + k for k in range(N)])
    builder = ChunkBuilder(length, split.obs[0], spec)
    rng = np.random.default_rng(0)
    chunks, trunc_values = [], np.empty(0, np.float32)
    for _ in range(steps):
        if spec.continuous:
            action = rng.uniform(-1, 1, (N, spec.action_dim)).astype(np.float32)
        else:
            action = rng.integers(spec.action_dim, size=N).astype(np.int32)
        finished = builder.on_policy(action, np.zeros(N, np.float32), np.zeros(N, np.float32),
                                     0, trunc_values, np.zeros((N, 0), np.float32))
        chunks += [dict(finished)] if finished is not None else []
        step = split.step([list(action)])
        builder.on_step(step.results[0])
        trunc_values = np.zeros(len(step.results[0].truncated_envs), np.float32)
    split.close()
    return chunks


@pytest.mark.parametrize("env_id", ["CartPole-v1", "ALE/Pong-v5", "HalfCheetah-v5"])
def test_envpool_and_gymnasium_rings_build_chunks_of_one_layout(env_id: str) -> None:
    """Fields, shapes and dtypes; the values are compared where they must agree, below."""
    gymnasium = _chunks(EnvConfig(id=env_id), steps=24, length=10)
    envpool = _chunks(EnvConfig(id=env_id, backend="envpool"), steps=24, length=10)
    assert len(gymnasium) == len(envpool) == 2
    for ours, theirs in zip(gymnasium, envpool, strict=True):
        assert {k: (v.shape, v.dtype) for k, v in ours.items()} == \
               {k: (v.shape, v.dtype) for k, v in theirs.items()}
    if env_id.startswith("ALE/"):  # uint8 [T+1, n, 84, 84, 4], newest frame last in both
        for chunks in (gymnasium, envpool):
            obs = chunks[0]["obs"]
            assert obs.shape == (11, N, 84, 84, 4) and obs.dtype == np.uint8
            assert np.array_equal(obs[1:, ..., :3], obs[:-1, ..., 1:])
            assert obs[-1, ..., 3].any()


def test_halfcheetah_without_reset_noise_builds_the_chunks_of_gymnasium() -> None:
    """No reset noise: both reset to MuJoCo's initial state, and the same actions give
    the same chunks, values and all, to float32 rounding."""
    config = EnvConfig(id="HalfCheetah-v5", kwargs={"reset_noise_scale": 0.0})
    gymnasium = _chunks(config, steps=24, length=10)
    envpool = _chunks(dataclasses.replace(config, backend="envpool"), steps=24, length=10)
    assert len(gymnasium) == len(envpool) == 2
    for ours, theirs in zip(gymnasium, envpool, strict=True):
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-5,
                                       err_msg=key)
        assert np.abs(ours["rewards"]).max() > 0.1, "the cheetah moved: rewards to compare"


def test_cartpole_steps_like_gymnasium_from_the_same_state() -> None:
    """EnvPool's start states copied into gymnasium's CartPoles: each env's first episode
    (env 0 pushes right and falls, the others balance to the time limit) has the same
    rewards, terminations, truncations and observations, final ones included."""
    limit = 25
    config = EnvConfig(id="CartPole-v1", kwargs={"max_episode_steps": limit})
    pool = EnvPoolSplit(dataclasses.replace(config, backend="envpool"), N, seed=11)
    ring = EnvSplit([make_env(config) for _ in range(N)], [11 + k for k in range(N)])
    assert not np.allclose(ring.obs, pool.obs), "one seed, two generators: other starts"
    for env, state in zip(ring.envs, pool.obs, strict=True):
        env.unwrapped.state = state.astype(np.float64)
    obs, first_episode, ends = pool.obs, np.ones(N, bool), {}
    for step in range(1, limit + 1):
        action = np.ones(N, np.int64)
        action[1:] = obs[1:, 2] + 0.5 * obs[1:, 3] > 0
        ours, theirs = ring.step(action.tolist()), pool.step(action.tolist())
        for field in ("rewards", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(ours, field)[first_episode],
                                          getattr(theirs, field)[first_episode], field)
        ended = ours.terminated | ours.truncated
        going_on = first_episode & ~ended  # a reset draws each its own start again
        np.testing.assert_allclose(ours.next_obs[going_on], theirs.next_obs[going_on],
                                   atol=1e-5)
        cut = first_episode[ours.truncated_envs]
        np.testing.assert_array_equal(ours.truncated_envs[cut], theirs.truncated_envs[cut])
        np.testing.assert_allclose(ours.final_obs[cut], theirs.final_obs[cut], atol=1e-5)
        ends.update({int(i): (step, bool(ours.terminated[i]))
                     for i in np.flatnonzero(first_episode & ended)})
        first_episode, obs = going_on, theirs.next_obs
    assert ends[0][1] and ends[0][0] < limit, "env 0 fell"
    assert all(ends[i] == (limit, False) for i in range(1, N)), "the others balanced"
    ring.close()
    pool.close()
