"""The evaluator worker: deterministic episodes with the latest parameters, every N updates.

Training returns come from exploring (sampled) actions, and from episodes that
span several policy versions. The evaluator takes a snapshot of the published
parameters every `evaluation.every_updates` versions, plays
`evaluation.episodes` episodes on its own environment with the most likely
action, and reports their returns; the metrics show them as
`eval_return_mean` (and `eval_policy_version`), apart from the training
returns. It runs the policy itself on CPU; it does not slow the actors.

The parameters of its best evaluation so far are saved under
`checkpoints/evaluated/` (what `load_policy(..., best=True)` and
`srl_jax.evaluate --best` take), and `stop.target_eval_return` can end the run
on an evaluation.

In a multi-agent environment it follows every policy's parameter stream and
plays the policies together; an evaluation is due when every policy has made
N more versions, its return is the team return (as `episode_return_mean` is),
and the best evaluation keeps each policy's parameters under that policy's
`evaluated/`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq

from actors.envs import env_seed, make_env, policy_spec
from learners.device_memory import device_memory_counters
from learners.export import TrainedPolicy, play_episode, play_team_episode
from learners.jax_runtime import configure_jax
from learners.networks import make_policy
from learners.param_stream import POLL_MS, ParamSubscriber, subscribe
from learners.policy import make_runner
from learners.policy_runner import PolicyRunner
from srl_jax.checkpoint import save_params
from srl_jax.config import is_pettingzoo, policy_names
from srl_jax.config_loader import config_to_dict
from srl_jax.run_dir import evaluated_root, step_meta, steps_in
from srl_jax.worker import Worker

EVALUATOR_ACTOR_INDEX = 1_000_000
"""Seeds the evaluator's episodes apart from every actor's environments."""


class EvaluatorWorker(Worker):
    kind = "evaluator"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.next_version = 0
        self.evaluations = 0
        self.episodes = 0
        self.eval_version = -1
        self.best_return = -float("inf")
        self._returns: list[float] = []

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        env = self.config.env
        self.team_names = policy_names(env)
        self.runners: list[PolicyRunner] = []
        self.team: list[TrainedPolicy] = []
        self.subscribers: list[ParamSubscriber] = []
        self.poller = zmq.Poller()
        for name in self.team_names:
            spec = policy_spec(self.config, name)
            runner = make_runner(self.config, spec, self.config.seed, 1, 1)
            policy, _ = make_policy(self.config, spec)
            self.runners.append(runner)
            self.team.append(TrainedPolicy(self.config, spec, policy, runner.params, step=0))
            self.subscribers.append(subscribe(self, runner, name))
            self.poller.register(self.subscribers[-1].socket, zmq.POLLIN)
        self.env = None if is_pettingzoo(env.id) else make_env(env)
        first = evaluated_root(self.run_dir, self.team_names[0])
        if saved := steps_in(first):  # a restarted evaluator
            self.best_return = step_meta(first, saved[-1])["eval_return_mean"]

    def run_once(self) -> None:
        ready = dict(self.poller.poll(POLL_MS))
        for subscriber in self.subscribers:
            if subscriber.socket in ready:
                subscriber.poll()
        version = min(runner.version for runner in self.runners)
        if all(runner.updates for runner in self.runners) and version >= self.next_version:
            self._evaluate(version)

    def _play(self, seed: int) -> float:
        if self.env is None:
            team_return, _ = play_team_episode(self.team, self.config.env, seed,
                                               deterministic=True, on_step=self.keep_alive)
            return team_return
        episode_return, _ = play_episode(self.team[0], self.env, seed, deterministic=True,
                                         on_step=self.keep_alive)
        return episode_return

    def _evaluate(self, version: int) -> None:
        """Play the episodes with a snapshot of every policy; `version`: the oldest of
        theirs (the only one in a single-policy run)."""
        cfg = self.config.evaluation
        versions = [runner.version for runner in self.runners]
        for trained, runner in zip(self.team, self.runners, strict=True):
            trained.params = runner.params  # stays on the device, a snapshot
        returns = []
        for episode in range(cfg.episodes):  # the same starts every time: comparable figures
            episode_return = self._play(env_seed(self.config.seed, EVALUATOR_ACTOR_INDEX,
                                                 episode))
            if self.stopping:
                return  # a cut episode is no evaluation
            returns.append(episode_return)
            self.episodes += 1
        mean = float(np.mean(returns))
        if mean > self.best_return:
            self.best_return = mean
            for name, trained, own in zip(self.team_names, self.team, versions, strict=True):
                save_params(evaluated_root(self.run_dir, name), own, trained.params, {
                    "version": own, "eval_policy_version": version, "eval_return_mean": mean,
                    "episodes": len(returns), "config": config_to_dict(self.config)})
        self._returns.extend(returns)
        self.evaluations += 1
        self.eval_version = version
        self.next_version = version + cfg.every_updates
        self.log.info("version %d: return %.1f over %d deterministic episodes", version, mean,
                      len(returns))

    def counters(self) -> dict[str, float]:
        return {"evaluations": self.evaluations, "eval_episodes": self.episodes,
                "eval_version": self.eval_version, **device_memory_counters()}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"eval_return": np.asarray(self._returns, np.float32)}
        self._returns = []
        return arrays

    def close(self) -> None:
        if getattr(self, "env", None) is not None:
            self.env.close()
        for subscriber in getattr(self, "subscribers", []):
            subscriber.socket.close()
