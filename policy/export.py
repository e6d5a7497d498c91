"""A trained policy out of a run directory, in one call, for notebooks and scripts.

    from srl_jax import load_policy
    policy = load_policy("runs/cartpole_ppo/20261202-120000")
    action = policy.act(observation)

Checkpoints are read where the run wrote them (its `checkpoint.dir`), or from
`checkpoint_dir` where they are now (say, a copy of a learner host's directory).

The policy is rebuilt from the config saved in the checkpoint and takes the
checkpoint's parameters (with their observation statistics). It acts on one
observation or a batch, deterministically (the most likely action) by default.
A multi-agent run's policies load together with `load_team`, and
`play_team_episode` plays them in their environment (one `actors.envs.TeamSplit` of one
env, made once and reused for every episode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from actors.envs import TeamSplit, policy_spec
from learners.algorithms.train_state import init_train_state
from learners.models.distributions import mask_logits
from learners.models.networks import Policy, init_policy_params, make_policy
from learners.training.checkpoint import read_step, restore_params
from learners.training.jax_runtime import configure_jax
from srl_jax.config.checkpoint_location import filesystem_problem, location_problem
from srl_jax.config.loader import config_from_dict, import_plugins
from srl_jax.config.operations import RuntimeConfig
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig, policy_names
from srl_jax.dataflow.algorithms import (
    algorithm,
    algorithm_config,
    extra_initializer,
    live_values,
    network_of,
    sizes,
)
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.metrics_table import agent_mean_returns
from srl_jax.runtime.run_dir import (
    checkpoint_meta,
    checkpoint_root,
    checkpoint_steps,
    evaluated_root,
    read_run_config,
    step_meta,
    steps_in,
)


class TrainedPolicy:
    """Acts with the parameters of one checkpoint.

    A recurrent policy keeps its state between calls, one row per observation of
    the batch; call `reset` when an episode starts (`play_episode` does).
    """

    def __init__(self, config: ExperimentConfig, spec: EnvSpec, policy: Policy, params: Any,
                 step: int, seed: int = 0) -> None:
        self.config, self.spec, self.params, self.step = config, spec, params, step
        self._key = jax.random.key(seed)
        self._calls = 0
        self.state = np.zeros((0, spec.state_size), np.float32)
        """The recurrent state of each row of the last batch (width 0 without a core)."""

        def sample(params: Any, obs: jax.Array, state: jax.Array, mask: jax.Array,
                   key: jax.Array, calls: jax.Array, deterministic: bool) -> tuple:
            out, _, new_state = policy.apply(params, obs, state)
            out = mask_logits(out, mask)
            if deterministic:
                return policy.dist.mode(out), new_state
            return policy.dist.sample(jax.random.fold_in(key, calls), out), new_state

        act, search_act = sample, network_of(config).search_act
        if search_act is not None:
            search = search_act(policy.network, algorithm_config(config), 0.0)

            def by_search(params: Any, obs: jax.Array, state: jax.Array, mask: jax.Array,
                          key: jax.Array, calls: jax.Array, deterministic: bool) -> tuple:
                """A policy that acts by search: its action, without sampling at the root."""
                return search(params, obs, state, mask, key, calls)[:, 2].astype("int32"), state

            act = by_search
        self._act = jax.jit(act, static_argnums=6)

    def reset(self, rows: np.ndarray | None = None) -> None:
        """Start new episodes: zero the recurrent state of `rows` (all rows if None)."""
        if rows is None:
            self.state = np.zeros((0, self.spec.state_size), np.float32)
        else:
            self.state[rows] = 0.0

    def act_batch(self, obs: np.ndarray, deterministic: bool = True,
                  mask: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of observations [N, ...], among the legal ones of `mask`
        [N, A] where the env masks actions, clipped to the action space; a batch of
        another size than the last starts from a zero state."""
        self._calls += 1
        batch = np.asarray(obs, self.spec.obs_dtype)
        if len(self.state) != len(batch):
            self.state = np.zeros((len(batch), self.spec.state_size), np.float32)
        legal = np.ones((len(batch), 0), bool) if mask is None else np.asarray(mask, bool)
        actions, state = self._act(self.params, batch, self.state, legal, self._key,
                                   np.uint32(self._calls), deterministic)
        actions, self.state = np.asarray(actions), np.array(state)
        if self.spec.continuous:
            actions = np.clip(actions, self.spec.action_low, self.spec.action_high)
        return actions

    def act(self, obs: np.ndarray, deterministic: bool = True) -> Any:
        """The action for one observation, as the environment takes it."""
        action = self.act_batch(np.asarray(obs)[None], deterministic)[0]
        return action if self.spec.continuous else int(action)


def play_episode(policy: TrainedPolicy, env: Any, seed: int | None, deterministic: bool = True,
                 frames: list[np.ndarray] | None = None,
                 on_step: Callable[[], bool] | None = None) -> tuple[float, int]:
    """One episode: (return, length). Appends rendered frames to `frames` if given;
    `on_step` is called after every step and may end the episode early by returning False."""
    obs, _ = env.reset(seed=seed)
    policy.reset()
    total, length, done = 0.0, 0, False
    while not done:
        if frames is not None:
            frames.append(env.render())
        obs, reward, terminated, truncated, _ = env.step(policy.act(obs, deterministic))
        total += float(reward)
        length += 1
        done = terminated or truncated or (on_step is not None and not on_step())
    if frames is not None:
        frames.append(env.render())
    return total, length


def play_episodes(policy: TrainedPolicy, envs: Sequence[Any], seeds: Sequence[int],
                  deterministic: bool = True,
                  on_step: Callable[[], bool] | None = None) -> list[tuple[float, int]] | None:
    """One episode on each of `envs`, from its seed, in lockstep: one batched policy call
    per step for all of them (a fixed batch, so one compiled program), where one episode
    at a time makes a call per step of each. (return, length) of each; None if `on_step`
    (called after every step) returned False, cutting them."""
    rows = len(envs)
    obs = np.stack([env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)])
    policy.reset()
    totals, lengths = np.zeros(rows), np.zeros(rows, int)
    running = np.ones(rows, bool)
    while running.any():
        actions = policy.act_batch(obs, deterministic)
        for row in np.flatnonzero(running).tolist():
            action = actions[row] if policy.spec.continuous else int(actions[row])
            obs[row], reward, terminated, truncated, _ = envs[row].step(action)
            totals[row] += float(reward)
            lengths[row] += 1
            running[row] = not (terminated or truncated)
        if on_step is not None and not on_step():
            return None
    return [(float(total), int(length)) for total, length in zip(totals, lengths, strict=True)]


@dataclass
class TeamEpisode:
    """One episode of a multi-agent environment, its returns as training reports them."""

    returns: dict[str, float]
    """Policy name -> the mean of its agents' own returns."""
    team_return: float
    """All agents' rewards summed."""
    agent_mean: float
    """The mean of every agent's own return (what `episode_return_mean` counts)."""
    length: int
    """Env steps."""


def play_team_episode(policies: Sequence[TrainedPolicy], split: TeamSplit, seed: int,
                      deterministic: bool = True, frames: list[np.ndarray] | None = None,
                      on_step: Callable[[], bool] | None = None) -> TeamEpisode:
    """One episode of `split`'s one environment, started anew from `seed`, each of
    `policies` (in `policy_names` order) acting for its agents. Make the split once
    (`actors.envs.make_split(env, 1, [seed])`) and pass it to every episode; its owner closes
    it. Appends rendered frames to `frames` if given (the env must then render, e.g.
    kwargs render_mode='rgb_array'); `on_step` is called after every step and may end
    the episode early by returning False."""
    split.reset([seed])
    sums, length = np.zeros(len(policies)), 0
    for policy in policies:
        policy.reset()
    while True:
        if frames is not None:
            frames.append(split.render())
        actions = [policy.act_batch(obs, deterministic, mask) for policy, obs, mask
                   in zip(policies, split.obs, split.masks, strict=True)]
        step = split.step([list(a) if p.spec.continuous else a.tolist()
                           for p, a in zip(policies, actions, strict=True)])
        for p, (policy, result) in enumerate(zip(policies, step.results, strict=True)):
            policy.reset(result.terminated | result.truncated)  # agents out of play
            sums[p] += float(result.rewards.sum())
        length += 1
        if step.episode_returns or (on_step is not None and not on_step()):
            break
    agents = [len(result.rewards) for result in step.results]  # one env: its agents
    team = float(sums.sum())
    return TeamEpisode({name: float(total) / n for name, total, n in
                        zip(split.policies, sums, agents, strict=True)},
                       team, agent_mean_returns([team], sum(agents))[0], length)


def use_run_compilation_cache(run_dir: Path) -> None:
    """The run's persistent compilation cache (`runtime.compilation_cache_dir`), as its
    workers use it: a second evaluation loads the policy's programs rather than compiling
    them (a CartPole LSTM's, 5 episodes and a video: 3.3 CPU-s against 5.5). A process that
    set a cache of its own (a notebook's, the test suite's) keeps it."""
    if jax.config.jax_compilation_cache_dir:
        return
    has_config = (run_dir / "config.yaml").is_file()
    configure_jax(read_run_config(run_dir).runtime if has_config else RuntimeConfig())


def load_team(run_dir: str | Path, step: int | None = None, best: bool = False,
              seed: int = 0, checkpoint_dir: str | None = None) -> dict[str, TrainedPolicy]:
    """Every policy of a run by name, in `policy_names` order (`default` alone for a
    single-agent run); the arguments mean what they do for `load_policy`."""
    run_dir = Path(run_dir)
    names = policy_names(read_run_config(run_dir).env) if (run_dir / "config.yaml").is_file() \
        else [DEFAULT_POLICY]  # not a run directory: load_policy says what is missing
    return {name: load_policy(run_dir, step, best, seed, name, checkpoint_dir)
            for name in names}


def load_policy(run_dir: str | Path, step: int | None = None, best: bool = False,
                seed: int = 0, policy: str = DEFAULT_POLICY,
                checkpoint_dir: str | None = None) -> TrainedPolicy:
    """The policy of a run's newest checkpoint, or of `step`, or the best one.

    Best is the evaluator's best evaluation when the run had an evaluator
    (`evaluation.every_updates`), else the best training return. In a run with
    several policies, `policy` names the one to load (its agents' observations).
    `checkpoint_dir`: where the checkpoints are, as `checkpoint.dir` takes it (None:
    where the run's config says). FileNotFoundError names the directory when there
    is nothing to load; ValueError a `checkpoint_dir` that cannot be one, and (as
    `CheckpointFormatError`, in one line) a checkpoint of another format than this
    srl_jax's, before its config is read.
    """
    run_dir = Path(run_dir)
    location = _location(run_dir, checkpoint_dir)
    if best and (evaluated := steps_in(evaluated_root(run_dir, policy, location))):
        return _load_evaluated(evaluated_root(run_dir, policy, location), evaluated[-1], seed,
                               policy)
    steps = checkpoint_steps(run_dir, best, policy, location)
    if not steps:
        what = "best checkpoint" if best else "complete checkpoint"
        raise FileNotFoundError(f"{run_dir} holds no {what} (looked in "
                                f"{checkpoint_root(run_dir, policy=policy, location=location)})")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"{run_dir} has no checkpoint step {step} (it has {steps})")
    step = steps[-1] if step is None else step
    config, spec, act, network = _rebuild(
        checkpoint_meta(run_dir, step, best, policy, location), policy)
    algo = algorithm(config.learner.algorithm)
    algo_config = algorithm_config(config)
    optimizer = algo.make_optimizer(algo_config, sizes(config))
    params = init_policy_params(network, spec.obs_shape, config.seed)
    like = init_train_state(params, optimizer, config.seed,
                            extra_initializer(algo, algo_config),
                            live_values(algo, algo_config))
    restored = read_step(run_dir, like, step, best, policy, location)
    return TrainedPolicy(config, spec, act, restored.state.params, step, seed)


def _rebuild(meta: dict[str, Any], policy: str = DEFAULT_POLICY) -> tuple:
    """(config, env spec, policy, network) from the config a checkpoint was saved with."""
    config = config_from_dict(meta["config"])
    import_plugins(config)  # the algorithm's optimizer shapes the checkpointed state
    spec = policy_spec(config, policy)
    return (config, spec, *make_policy(config, spec))


def _location(run_dir: Path, checkpoint_dir: str | None) -> str:
    """`checkpoint_dir`, checked, or the run's own `checkpoint.dir`."""
    if checkpoint_dir is None:
        has_config = (run_dir / "config.yaml").is_file()
        return read_run_config(run_dir).checkpoint.dir if has_config else ""
    if problem := location_problem(checkpoint_dir) or filesystem_problem(checkpoint_dir):
        raise ValueError(f"checkpoint directory {problem}")
    return checkpoint_dir


def _load_evaluated(root: Path, step: int, seed: int, name: str) -> TrainedPolicy:
    config, spec, policy, network = _rebuild(step_meta(root, step), name)
    like = init_policy_params(network, spec.obs_shape, config.seed)
    restored = restore_params(root, step, like)
    return TrainedPolicy(config, spec, policy, restored.state, step, seed)
