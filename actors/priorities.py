"""Ape-X's initial priorities, computed where the data is made (Horgan et al. 2018).

With many actors, giving each new transition the largest priority seen focuses replay on
the newest data; Ape-X has the actors compute each transition's n-step TD error with
their own copy of the network instead. Here the inference server's replies carry every
action's Q-value (`EnvSpec.action_values`), the actor keeps the Q of the action it took
(after exploring) in the chunk's `priorities`, and when the chunk is complete this turns
them into priorities, in numpy.

The windows are replay's (replay/buffer.py) and the targets the learner's
(learners/algorithms/dqn.py): up to n steps, stopping at the end of an episode or of the
chunk; the discounted rewards (scaled and clipped as the learner does), plus gamma^k times
the bootstrap: 0 after a termination, the final observation's value after a time-limit
cut, else the acting network's max Q of the observation after the window (`values`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import algorithm_config, replay_of, sizes


def initial_priorities(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                       trunc_values: np.ndarray, values: np.ndarray, q_taken: np.ndarray,
                       gamma: float, n: int, reward_scale: float = 1.0,
                       reward_clip: float = 0.0, epsilon: float = 1e-6) -> np.ndarray:
    """|n-step target - Q(s, a)| + epsilon for each step of a chunk: arrays [T, columns]
    but `values` [T + 1, columns] (max Q of each observation, the last the bootstrap)."""
    T, columns = rewards.shape
    scaled = rewards.astype(np.float64) * reward_scale
    if reward_clip > 0:
        scaled = np.clip(scaled, -reward_clip, reward_clip)
    ends = terminated.astype(bool) | truncated.astype(bool)
    returns = np.zeros((T, columns))
    steps = np.zeros((T, columns), np.int64)
    open_ = np.ones((T, columns), bool)
    for k in range(n):
        shifted_reward, shifted_end = np.zeros_like(scaled), np.zeros_like(ends)
        shifted_reward[:T - k], shifted_end[:T - k] = scaled[k:], ends[k:]
        take = open_ & (np.arange(T) + k < T)[:, None]
        returns += np.where(take, gamma ** k * shifted_reward, 0.0)
        steps += take
        open_ = take & ~shifted_end
    last = np.arange(T)[:, None] + steps - 1
    cols = np.arange(columns)[None, :]
    bootstrap = np.where(terminated[last, cols].astype(bool), 0.0,
                         np.where(truncated[last, cols].astype(bool),
                                  trunc_values[last, cols], values[last + 1, cols]))
    targets = returns + gamma ** steps * bootstrap
    return (np.abs(targets - q_taken) + epsilon).astype(np.float32)


def fill_priorities(chunk: dict[str, np.ndarray], gamma: float, n: int, reward_scale: float,
                    reward_clip: float, epsilon: float) -> None:
    """A finished chunk's `priorities`, which held the Q-value of each action taken, made
    the steps' initial priorities (`initial_priorities`), in place."""
    taken = chunk["priorities"][:, :, 0]
    taken[:] = initial_priorities(chunk["rewards"], chunk["terminated"], chunk["truncated"],
                                  chunk["trunc_values"], chunk["values"], taken, gamma, n,
                                  reward_scale, reward_clip, epsilon)


def chunk_prioritizer(config: ExperimentConfig) -> Callable[[dict[str, np.ndarray]], None]:
    """`fill_priorities` with the run's discount, window, reward scaling and priority
    epsilon: the learner's."""
    settings = algorithm_config(config)
    run = sizes(config)
    return partial(fill_priorities, gamma=settings.gamma,
                   n=replay_of(config).window(settings),
                   reward_scale=run.reward_scale, reward_clip=run.reward_clip,
                   epsilon=settings.priority_epsilon)
