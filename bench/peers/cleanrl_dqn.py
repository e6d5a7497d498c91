"""Single-process baseline: cleanrl-style JAX DQN on CartPole-v1, time to a greedy return.

What it is: the DQN a user would write on one machine instead of running srl_jax
(`cartpole_dqn`), in cleanrl's single-file style (`dqn_jax.py`), with srl_jax's
algorithm and hyperparameters read from the same config (`configs/cartpole_dqn.yaml`,
through srl_jax's own loader, so every default not written there is the same too):

- acting: one gymnasium `SyncVectorEnv` of actors.count x actors.envs (16) CartPoles
  stepped in this process, greedy on the current parameters, each env column
  exploring at its rung of Ape-X's epsilon ladder over those 16 columns
  (actors.epsilon 0.4, epsilon_alpha 7);
- replay: a ring of replay.capacity transitions, sampled in proportion to
  priority ** priority_exponent with a sum tree (stratified, as Ape-X), new
  transitions at the largest priority seen, importance weights
  (N * P) ** -importance_exponent, windows of learner.dqn.n_step steps that stop
  at an episode's end or at the newest step (shorter windows bootstrap sooner);
- learning: from replay.min_size transitions on, updates of learner.batch_envs
  (128) rows so that sampled rows / inserted transitions = samples_per_insert
  (8: one update per vector step of 16 envs), each row's new priority its
  |TD error| + epsilon, written back before the next step;
- the update: learners.algorithms.dqn's, unchanged (double DQN, dueling head, n-step
  targets, importance-weighted Huber loss, Adam with eps adam_eps, gradient clip,
  target network copied every target_update_period updates), on the network
  srl_jax builds (network.hidden 128x128, relu, dueling).

It imports srl_jax's pure pieces so that the algorithm is the same and the
comparison measures the system, not the math: the config loader, the Q-network
and its parameter init (`learners.models.networks`), the update and the optimizer
(`learners.algorithms.dqn`), the `TrainState` (`learners.algorithms.train_state`), the sum tree
(`replay.sum_tree`), the epsilon ladder and `explore` (`actors.exploration`) and
the env factory and seeds (`actors.envs`). The env loop, the replay ring and its
n-step windows, the samples-per-insert schedule and the evaluation are written
here, as a user would write them. A time-limit cut bootstraps as srl_jax's does:
from the acting network's max Q of the final observation, taken when it is seen.

Evaluation, as srl_jax's evaluator (policy/evaluator.py): every
evaluation.every_updates (250) updates, evaluation.episodes (5) episodes on envs of
its own, greedy, from the evaluator's seeds (the same starts every time), their
mean return `eval_return_mean`. srl_jax's evaluator runs beside the learner in a
process of its own; here the episodes run in this process, in lockstep (one
batched forward pass a step), and learning waits for them. `stop.target_eval_return`
(475) ends the run on an evaluation.

Why it exists: the distributed system must beat one process on the same cores.
This script gives the figures to beat: time to the target evaluation return from
start, frames at that point, steady frames/s and start-up time.

Output: one JSON line per `--report-interval` (1 s) on stdout,
`{"wall", "time", "env_frames", "updates", "episode_return_mean", "episodes"}`,
where `time` counts from the top of this file (before the heavy imports) and
`episode_return_mean` is the mean return of the training episodes (exploring)
that finished since the previous row (absent when none did); and one line right
after each evaluation, `{"wall", "time", "env_frames", "updates",
"eval_return_mean"}`. It stops when an evaluation's mean reaches `--target-return`
(default stop.target_eval_return), or at `--seconds` (default stop.wall_time_s)
or stop.env_frames (checked after each vector step), and prints a last line
`{"done": "target"|"seconds"|"frames", ...}`; it exits 0 in all three cases.

    .venv/bin/python -m bench.peers.cleanrl_dqn                # seed 1, stop at 475
    .venv/bin/python -m bench.peers.cleanrl_dqn --seed 2 --set replay.samples_per_insert=4
    .venv/bin/python -m bench.peers.cleanrl_dqn --target-return none --seconds 30   # steady fps
"""

from __future__ import annotations

import time

START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from actors.envs import env_seed, make_env, policy_spec  # noqa: E402
from actors.exploration import epsilon_ladder, explore  # noqa: E402
from bench.harness.machine import CONFIGS_DIR  # noqa: E402
from bench.peers.cleanrl_ppo import target_value  # noqa: E402
from learners.algorithms.train_state import TrainState, init_train_state  # noqa: E402
from learners.models.networks import init_policy_params, make_policy  # noqa: E402
from policy.evaluator import EVALUATOR_ACTOR_INDEX  # noqa: E402
from replay.sum_tree import SumTree  # noqa: E402
from srl_jax.config.loader import load_config  # noqa: E402
from srl_jax.config.schema import ExperimentConfig  # noqa: E402
from srl_jax.dataflow.algorithms import (  # noqa: E402
    algorithm,
    algorithm_config,
    extra_initializer,
    live_values,
    sizes,
)

DEFAULT_CONFIG = CONFIGS_DIR / "cartpole_dqn.yaml"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; every hyperparameter comes from the config."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help="srl_jax experiment YAML (default: configs/cartpole_dqn.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as srl_jax.launch's --set (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="default: the config's seed")
    p.add_argument("--target-return", default=None,
                   help="stop when an evaluation's mean reaches it (default: the config's "
                        "stop.target_eval_return); none to disable")
    p.add_argument("--seconds", type=float, default=None,
                   help="wall-time limit from start (default: the config's stop.wall_time_s, "
                        "else 300)")
    p.add_argument("--report-interval", type=float, default=1.0, help="seconds between rows")
    args = p.parse_args(argv)
    if args.seed is not None:
        args.overrides.append(f"seed={args.seed}")
    return args


class PrioritizedReplay:
    """A ring of `capacity // columns` vector steps of `columns` transitions each,
    sampled by priority; transition (slot, column) is leaf slot * columns + column."""

    def __init__(self, capacity: int, columns: int, obs_shape: tuple[int, ...],
                 obs_dtype: Any, window: int, alpha: float, beta: float, seed: int) -> None:
        self.slots, self.columns, self.window = max(capacity // columns, window), columns, window
        self.alpha, self.beta = alpha, beta
        S, N = self.slots, columns
        self.obs = np.zeros((S, N, *obs_shape), obs_dtype)
        self.next_obs = np.zeros((S, N, *obs_shape), obs_dtype)  # the final obs at an end
        self.actions = np.zeros((S, N), np.int32)
        self.rewards = np.zeros((S, N), np.float32)
        self.terminated = np.zeros((S, N), bool)
        self.truncated = np.zeros((S, N), bool)
        self.trunc_values = np.zeros((S, N), np.float32)
        self.step_of = np.full(S, -1, np.int64)  # which vector step each slot holds
        self.tree = SumTree(S * N)
        self.max_priority = 1.0
        self.steps = 0
        self.rng = np.random.default_rng(seed)

    @property
    def size(self) -> int:
        return min(self.steps, self.slots) * self.columns

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray, trunc_values: np.ndarray,
            next_obs: np.ndarray) -> None:
        """One vector step's transitions, at the largest priority seen so far."""
        s = self.steps % self.slots
        self.obs[s], self.actions[s], self.rewards[s] = obs, actions, rewards
        self.terminated[s], self.truncated[s] = terminated, truncated
        self.trunc_values[s], self.next_obs[s] = trunc_values, next_obs
        self.step_of[s] = self.steps
        self.tree.update(s * self.columns + np.arange(self.columns),
                         np.full(self.columns, self.max_priority ** self.alpha))
        self.steps += 1

    def sample(self, rows: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """A batch of `rows` transitions with their n-step windows, and their leaves."""
        leaves = self.tree.sample(rows, self.rng)
        slot, col = leaves // self.columns, leaves % self.columns
        probabilities = self.tree.values(leaves) / self.tree.total
        k = np.arange(self.window)
        at = (slot[:, None] + k) % self.slots  # [rows, n]: the slots of the window's steps
        written = self.step_of[at] == self.step_of[slot][:, None] + k  # not past the newest
        ends = (self.terminated[at, col[:, None]] | self.truncated[at, col[:, None]]) & written
        taken = written & (np.cumsum(ends, axis=1) - ends == 0)  # up to the first end
        steps = taken.sum(1)
        last = at[np.arange(rows), steps - 1]
        batch = {
            "obs": self.obs[slot, col],
            "actions": self.actions[slot, col],
            "rewards": np.where(taken, self.rewards[at, col[:, None]], 0.0).astype(np.float32),
            "steps": steps.astype(np.int32),
            "terminated": self.terminated[last, col].astype(np.float32),
            "truncated": self.truncated[last, col].astype(np.float32),
            "trunc_values": self.trunc_values[last, col],
            "next_obs": self.next_obs[last, col],
            "weights": ((self.size * probabilities) ** -self.beta).astype(np.float32),
        }
        return batch, leaves

    def update_priorities(self, leaves: np.ndarray, priorities: np.ndarray) -> None:
        self.tree.update(leaves, priorities ** self.alpha)
        self.max_priority = max(self.max_priority, float(priorities.max()))


def make_agent(config: ExperimentConfig, spec: Any) -> tuple[TrainState, Callable, Callable]:
    """The initial train state (online and target network), the jitted `act` (greedy
    actions and max Q of a batch of observations) and the jitted learners.algorithms.dqn update."""
    policy, network = make_policy(config, spec)
    algo = algorithm("dqn")
    dqn, derived = algorithm_config(config), sizes(config)
    optimizer = algo.make_optimizer(dqn, derived)

    @jax.jit
    def init() -> TrainState:
        params = init_policy_params(network, spec.obs_shape, config.seed)
        return init_train_state(params, optimizer, config.seed, extra_initializer(algo, dqn),
                                live_values(algo, dqn))

    @jax.jit
    def act(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        q, value, _ = policy.apply(params, obs, jnp.zeros((obs.shape[0], 0), jnp.float32))
        return jnp.argmax(q, -1), value

    update = jax.jit(algo.make_update(policy, optimizer, dqn, derived), donate_argnums=0)
    return init(), act, update


def evaluate(act: Callable, params: Any, envs: list[gym.Env], seeds: list[int]) -> float:
    """Mean return of one greedy episode on each env, all stepped in lockstep."""
    obs = np.stack([env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)])
    returns = np.zeros(len(envs))
    playing = np.ones(len(envs), bool)
    while playing.any():
        actions = np.asarray(act(params, obs)[0])
        for i in np.flatnonzero(playing):
            obs[i], reward, terminated, truncated, _ = envs[i].step(int(actions[i]))
            returns[i] += float(reward)
            playing[i] = not (terminated or truncated)
    return float(returns.mean())


def emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = load_config(args.config, args.overrides)
    target = (config.stop.target_eval_return if args.target_return is None
              else target_value(args.target_return))
    seconds = args.seconds or config.stop.wall_time_s or 300.0
    spec = policy_spec(config)
    dqn = algorithm_config(config)
    N = config.actors.count * config.actors.envs
    B, spi = config.learner.batch_envs, config.replay.samples_per_insert

    envs = gym.vector.SyncVectorEnv([lambda: make_env(config.env) for _ in range(N)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    n_actions = int(envs.single_action_space.n)
    epsilons = epsilon_ladder(config.actors.epsilon, config.actors.epsilon_alpha, N)
    explore_rng = np.random.default_rng(config.seed)
    eval_envs = [make_env(config.env) for _ in range(config.evaluation.episodes)]
    eval_seeds = [env_seed(config.seed, EVALUATOR_ACTOR_INDEX, i)
                  for i in range(config.evaluation.episodes)]

    state, act, update = make_agent(config, spec)
    replay = PrioritizedReplay(config.replay.capacity, N, spec.obs_shape, spec.obs_dtype,
                               dqn.n_step, config.replay.priority_exponent,
                               config.replay.importance_exponent, config.seed)

    obs, _ = envs.reset(seed=config.seed)
    ep_return = np.zeros(N, np.float64)
    finished: list[float] = []  # returns of training episodes finished since the last row
    frames = updates = 0
    credit = 0.0  # rows the updates may still sample: samples_per_insert x inserted
    every = config.evaluation.every_updates
    last_row = time.time()
    done_reason = None
    while done_reason is None:
        greedy, _ = act(state.params, obs)
        actions = explore(np.asarray(greedy), epsilons, n_actions, explore_rng)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        done = terminated | truncated
        real_next = next_obs
        trunc_values = np.zeros(N, np.float32)
        if done.any():
            real_next = next_obs.copy()
            real_next[done] = np.stack(info["final_obs"][done])
            if truncated.any():  # the bootstrap of a time-limit cut: max Q of its final obs
                trunc_values[truncated] = np.asarray(act(state.params, real_next)[1])[truncated]
        replay.add(obs, actions, reward, terminated, truncated, trunc_values, real_next)
        obs = next_obs
        frames += N
        ep_return += reward
        if done.any():
            finished.extend(ep_return[done].tolist())
            ep_return[done] = 0.0

        eval_return = None
        if replay.size >= config.replay.min_size:
            credit += N * spi
            while credit >= B:
                batch, leaves = replay.sample(B)
                state, metrics = update(state, batch)
                replay.update_priorities(leaves, np.asarray(metrics["priorities"], np.float64))
                credit -= B
                updates += 1
                if every and updates % every == 0:
                    eval_return = evaluate(act, state.params, eval_envs, eval_seeds)
                    now = time.time()
                    emit({"wall": now, "time": now - START, "env_frames": frames,
                          "updates": updates, "eval_return_mean": eval_return})
                    if target is not None and eval_return >= target:
                        done_reason = "target"
                        break

        now = time.time()
        if done_reason is None:
            if config.stop.env_frames and frames >= config.stop.env_frames:
                done_reason = "frames"
            elif now - START >= seconds:
                done_reason = "seconds"
        if now - last_row >= args.report_interval or done_reason is not None:
            row: dict[str, Any] = {"wall": now, "time": now - START, "env_frames": frames,
                                   "updates": updates}
            if finished:
                row["episode_return_mean"] = float(np.mean(finished))
            row["episodes"] = len(finished)
            emit(row)
            finished.clear()
            last_row = now
    envs.close()
    for env in eval_envs:
        env.close()
    now = time.time()
    emit({"done": done_reason, "wall": now, "time": now - START, "env_frames": frames,
          "updates": updates})
    return 0


if __name__ == "__main__":
    sys.exit(main())
