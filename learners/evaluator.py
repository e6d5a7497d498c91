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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from actors.envs import env_seed, env_spec, make_env
from learners.export import TrainedPolicy, play_episode
from learners.jax_runtime import configure_jax
from learners.networks import make_policy
from learners.param_stream import POLL_MS, subscribe
from learners.policy import PolicyRunner
from srl_jax.checkpoint import save_params
from srl_jax.config import config_to_dict
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
        spec = env_spec(self.config.env)
        self.runner = PolicyRunner(self.config, spec, self.config.seed, 1, 1)
        policy, _ = make_policy(self.config, spec)
        self.trained = TrainedPolicy(self.config, spec, policy, self.runner.params, step=0)
        self.env = make_env(self.config.env)
        self.subscriber = subscribe(self, self.runner)
        if saved := steps_in(evaluated_root(self.run_dir)):  # a restarted evaluator
            self.best_return = step_meta(evaluated_root(self.run_dir), saved[-1])[
                "eval_return_mean"]

    def run_once(self) -> None:
        if self.subscriber.socket.poll(POLL_MS):
            self.subscriber.poll()
        if self.runner.updates and self.runner.version >= self.next_version:
            self._evaluate(self.runner.version)

    def _evaluate(self, version: int) -> None:
        cfg = self.config.evaluation
        self.trained.params = self.runner.params  # stays on the device, a snapshot of `version`
        returns = []
        for episode in range(cfg.episodes):  # the same starts every time: comparable figures
            seed = env_seed(self.config.seed, EVALUATOR_ACTOR_INDEX, episode)
            episode_return, _ = play_episode(self.trained, self.env, seed, deterministic=True,
                                             on_step=self.keep_alive)
            if self.stopping:
                return  # a cut episode is no evaluation
            returns.append(episode_return)
            self.episodes += 1
        mean = float(np.mean(returns))
        if mean > self.best_return:
            self.best_return = mean
            save_params(evaluated_root(self.run_dir), version, self.trained.params, {
                "version": version, "eval_return_mean": mean, "episodes": len(returns),
                "config": config_to_dict(self.config)})
        self._returns.extend(returns)
        self.evaluations += 1
        self.eval_version = version
        self.next_version = version + cfg.every_updates
        self.log.info("version %d: return %.1f over %d deterministic episodes", version, mean,
                      len(returns))

    def counters(self) -> dict[str, float]:
        return {"evaluations": self.evaluations, "eval_episodes": self.episodes,
                "eval_version": self.eval_version}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"eval_return": np.asarray(self._returns, np.float32)}
        self._returns = []
        return arrays

    def close(self) -> None:
        if getattr(self, "env", None) is not None:
            self.env.close()
        if getattr(self, "subscriber", None) is not None:
            self.subscriber.socket.close()
