"""Ape-X's actor-computed initial priorities (actors/priorities.py, replay/buffer.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from actors.envs import policy_spec
from actors.priorities import initial_priorities
from replay.buffer import ReplayBuffer
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from tests.conftest import make_config

CARTPOLE = EnvSpec((4,), np.dtype(np.float32), 2, False)


def test_priorities_are_the_n_step_td_errors_of_the_acting_network() -> None:
    """By hand, gamma 0.5 and n 3: column 0 terminates at step 1, column 1 is cut by a time
    limit at step 2 (its final observation worth 5); the chunk ends after step 3 (the next
    observations worth 7 and 8); every reward 1, every Q of an action taken 0."""
    rewards = np.ones((4, 2), np.float32)
    terminated = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], bool)
    truncated = np.array([[0, 0], [0, 0], [0, 1], [0, 0]], bool)
    trunc_values = np.array([[0, 0], [0, 0], [0, 5], [0, 0]], np.float32)
    values = np.array([[10, 10], [10, 10], [10, 10], [10, 10], [7, 8]], np.float32)
    taken = np.zeros((4, 2), np.float32)
    got = initial_priorities(rewards, terminated, truncated, trunc_values, values, taken,
                             gamma=0.5, n=3, epsilon=0.0)
    expected = [[1 + 0.5, 1 + 0.5 + 0.25 + 0.125 * 5],  # to the end; three steps, cut: 5
                [1, 1 + 0.5 + 0.25 * 5],
                [1 + 0.5 + 0.25 * 7, 1 + 0.5 * 5],  # two steps to the chunk's end: 7
                [1 + 0.5 * 7, 1 + 0.5 * 8]]
    np.testing.assert_allclose(got, expected)
    # |target - Q|, scaled and clipped rewards as the learner's, plus epsilon
    minus = initial_priorities(rewards * 4, terminated, truncated, trunc_values, values,
                               np.full((4, 2), 100, np.float32), gamma=0.5, n=3,
                               reward_scale=0.5, reward_clip=1.0, epsilon=0.01)
    np.testing.assert_allclose(minus, 100 - np.asarray(expected) + 0.01, rtol=1e-6)


def test_replay_takes_the_actors_priorities_and_samples_by_them() -> None:
    spec = dataclasses.replace(CARTPOLE, action_values=True)
    T, n = 8, 4
    buffer = ReplayBuffer(1024, T, n, spec, 1, priority_exponent=1.0,
                          importance_exponent=0.4, seed=0)
    chunk = empty_chunk(T, n, spec)
    chunk["priorities"][:, :, 0] = 0.01
    chunk["priorities"][:, 2, 0] = 9.0  # one column the actor found surprising
    buffer.insert(chunk)
    assert buffer.max_priority == 9.0
    slots = buffer.sample(4096, 1)["slots"]
    column = (slots // T) % n  # one segment per column
    assert np.mean(column == 2) > 0.95, "sampled as the actor's priorities say"
    # Without them (width 0: replay.initial_priority max), the largest seen so far.
    plain = ReplayBuffer(1024, T, n, CARTPOLE, 1, 1.0, 0.4, seed=0)
    plain.insert(empty_chunk(T, n, CARTPOLE))
    assert (plain.priorities[:T * n] == 1.0).all()


def test_only_a_q_policy_with_actor_priorities_has_them_in_its_replies_and_chunks() -> None:
    apex = make_config(["learner.algorithm=dqn", "replay.count=1", "network.head=dueling",
                        "replay.initial_priority=actor"])
    assert policy_spec(apex).action_values
    for overrides in (["replay.initial_priority=max"], []):
        other = make_config(["learner.algorithm=dqn", "replay.count=1",
                             "network.head=dueling", *overrides])
        assert not policy_spec(other).action_values
    assert not policy_spec(make_config([])).action_values
    assert empty_chunk(4, 2, CARTPOLE)["priorities"].shape == (4, 2, 0)
