"""The evaluator worker: deterministic episodes with the latest parameters, every N updates.

Training returns come from exploring (sampled) actions, and from episodes that
span several policy versions. The evaluator takes a snapshot of the published
parameters every `evaluation.every_updates` versions, plays
`evaluation.episodes` episodes on its own environment with the most likely
action, and reports their returns; the metrics show them as
`eval_return_mean` (and `eval_policy_version`), apart from the training
returns. It runs the policy itself on CPU; it does not slow the actors.

The parameters of its best evaluation so far are saved under `evaluated/` of
the checkpoint location (`checkpoint.dir`: `checkpoints/evaluated/` by default;
what `load_policy(..., best=True)` and `srl_jax.evaluate --best` take), and
`stop.target_eval_return` can end the run on an evaluation.

In a multi-agent environment it follows every policy's parameter stream and
plays the policies together; an evaluation is due when every policy has made
N more versions, its return is the team return (as `episode_return_mean` is),
and the best evaluation keeps each policy's parameters under that policy's
`evaluated/`. In a population it evaluates each member on its own, when that member
has made N more versions, and reports `policy/<member>/eval_return_mean`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
from srl_jax.config import is_pettingzoo, member_names, policy_names
from srl_jax.config_loader import config_to_dict
from srl_jax.run_dir import evaluated_root, step_meta, steps_in
from srl_jax.worker import Worker

EVALUATOR_ACTOR_INDEX = 1_000_000
"""Seeds the evaluator's episodes apart from every actor's environments."""


@dataclass
class _Group:
    """Policies evaluated together: a multi-agent team (or the one policy of a run), or
    one population member. `label` names its figures ('' for the run's own)."""

    label: str
    names: list[str]
    runners: list[PolicyRunner] = field(default_factory=list)
    team: list[TrainedPolicy] = field(default_factory=list)
    next_version: int = 0
    eval_version: int = -1
    best_return: float = -float("inf")
    returns: list[float] = field(default_factory=list)
    """Episode returns not yet sent with a heartbeat."""


class EvaluatorWorker(Worker):
    kind = "evaluator"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.evaluations = 0
        self.episodes = 0
        self.groups: list[_Group] = []

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        env = self.config.env
        members = member_names(self.config.population.members)
        self.groups = [_Group(m, [m]) for m in members] or [_Group("", policy_names(env))]
        self.subscribers: list[ParamSubscriber] = []
        self.poller = zmq.Poller()
        for group in self.groups:
            for name in group.names:
                spec = policy_spec(self.config, name)
                runner = make_runner(self.config, spec, self.config.seed, 1, 1)
                policy, _ = make_policy(self.config, spec)
                group.runners.append(runner)
                group.team.append(TrainedPolicy(self.config, spec, policy, runner.params,
                                                step=0))
                self.subscribers.append(subscribe(self, runner, name))
                self.poller.register(self.subscribers[-1].socket, zmq.POLLIN)
            first = evaluated_root(self.run_dir, group.names[0], self.config.checkpoint.dir)
            if saved := steps_in(first):  # a restarted evaluator
                group.best_return = step_meta(first, saved[-1])["eval_return_mean"]
        self.env = None if is_pettingzoo(env.id) else make_env(env)

    def run_once(self) -> None:
        ready = dict(self.poller.poll(POLL_MS))
        for subscriber in self.subscribers:
            if subscriber.socket in ready:
                subscriber.poll()
        for group in self.groups:
            version = min(runner.version for runner in group.runners)
            if all(runner.updates for runner in group.runners) and \
                    version >= group.next_version:
                self._evaluate(group, version)

    def _play(self, team: list[TrainedPolicy], seed: int) -> float:
        if self.env is None:
            team_return, _ = play_team_episode(team, self.config.env, seed,
                                               deterministic=True, on_step=self.keep_alive)
            return team_return
        episode_return, _ = play_episode(team[0], self.env, seed, deterministic=True,
                                         on_step=self.keep_alive)
        return episode_return

    def _evaluate(self, group: _Group, version: int) -> None:
        """Play the episodes with a snapshot of the group's policies; `version`: the oldest
        of theirs (the only one of a single policy)."""
        cfg = self.config.evaluation
        versions = [runner.version for runner in group.runners]
        for trained, runner in zip(group.team, group.runners, strict=True):
            trained.params = runner.params  # stays on the device, a snapshot
        returns = []
        for episode in range(cfg.episodes):  # the same starts every time: comparable figures
            episode_return = self._play(group.team, env_seed(
                self.config.seed, EVALUATOR_ACTOR_INDEX, episode))
            if self.stopping:
                return  # a cut episode is no evaluation
            returns.append(episode_return)
            self.episodes += 1
        mean = float(np.mean(returns))
        if mean > group.best_return:
            group.best_return = mean
            location = self.config.checkpoint.dir
            for name, trained, own in zip(group.names, group.team, versions, strict=True):
                save_params(evaluated_root(self.run_dir, name, location), own, trained.params, {
                    "version": own, "eval_policy_version": version, "eval_return_mean": mean,
                    "episodes": len(returns), "config": config_to_dict(self.config)})
        group.returns.extend(returns)
        self.evaluations += 1
        group.eval_version = version
        group.next_version = version + cfg.every_updates
        self.log.info("%sversion %d: return %.1f over %d deterministic episodes",
                      f"{group.label} " if group.label else "", version, mean, len(returns))

    def counters(self) -> dict[str, float]:
        return {"evaluations": self.evaluations, "eval_episodes": self.episodes,
                **{_labelled("eval_version", g.label): g.eval_version for g in self.groups},
                **device_memory_counters()}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        arrays = {}
        for group in self.groups:
            arrays[_labelled("eval_return", group.label)] = np.asarray(group.returns,
                                                                      np.float32)
            group.returns = []
        return arrays

    def close(self) -> None:
        if getattr(self, "env", None) is not None:
            self.env.close()
        for subscriber in getattr(self, "subscribers", []):
            subscriber.socket.close()


def _labelled(key: str, label: str) -> str:
    """A group's counter or array: `eval_return`, or `eval_return/<member>`."""
    return f"{key}/{label}" if label else key
