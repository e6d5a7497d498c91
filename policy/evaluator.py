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
plays the policies together (one env, reused for every episode); an evaluation is
due when every policy has made N more versions. It reports each policy's own return
(`policy/<name>/eval_return_mean`: the mean of its agents' returns), the team
return (`team_eval_return_mean`) and the mean of every agent's own return
(`eval_return_mean`), as training reports its returns. Each policy's parameters
are kept under its own `evaluated/` when its own return beats its best so far (in
a competitive game the team sum would crown the side that won for both sides).
In a population it evaluates each member on its own, when that member
has made N more versions, and reports `policy/<member>/eval_return_mean`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from actors.envs import env_seed, make_env, make_team_split, policy_spec
from learners.models.networks import make_policy
from learners.training.checkpoint import save_params
from learners.training.jax_runtime import configure_jax, device_memory_counters
from policy.acting import make_runner
from policy.export import (
    TeamEpisode,
    TrainedPolicy,
    play_episodes,
    play_team_episode,
)
from policy.param_stream import POLL_MS, ParamSubscriber, subscribe
from policy.policy_runner import PolicyRunner
from srl_jax.config.env_families import family_of
from srl_jax.config.loader import config_to_dict
from srl_jax.config.schema import member_names, policy_names
from srl_jax.dataflow.metrics_table import TEAM_EVAL_RETURN
from srl_jax.runtime.run_dir import evaluated_root, step_meta, steps_in
from srl_jax.runtime.worker_base import Worker

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
    best: dict[str, float] = field(default_factory=dict)
    """Policy name -> its own best evaluation return so far."""
    versions: dict[str, int] = field(default_factory=dict)
    """Policy name -> its version in the last evaluation."""
    episodes: list[TeamEpisode] = field(default_factory=list)
    """Episodes not yet sent with a heartbeat."""


@dataclass
class Evaluated:
    """One policy's part in an evaluation: its parameters and its own returns."""

    name: str
    version: int
    params: Any
    returns: list[float]


def keep_best(best: dict[str, float], evaluated: Sequence[Evaluated],
              root: Callable[[str], Path], meta: dict[str, Any]) -> list[str]:
    """Save the parameters of each policy whose own mean return beats its `best` so far
    under `root(name)` (its `evaluated/`), with `meta`, and raise its `best`; the names
    saved. Each policy is ranked by its own return alone, never by its team's."""
    saved = []
    for policy in evaluated:
        mean = float(np.mean(policy.returns))
        if mean > best.get(policy.name, -float("inf")):
            best[policy.name] = mean
            save_params(root(policy.name), policy.version, policy.params,
                        {**meta, "version": policy.version, "eval_return_mean": mean})
            saved.append(policy.name)
    return saved


class EvaluatorWorker(Worker):
    kind = "evaluator"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.evaluations = 0
        self.episodes = 0
        self.groups: list[_Group] = []
        self.multi_agent = family_of(self.config.env).multi_agent

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        env = self.config.env
        members = member_names(self.config.population.members)
        self.groups = [_Group(m, [m]) for m in members] or [_Group("", policy_names(env))]
        self.subscribers: list[ParamSubscriber] = []
        self.poller = zmq.Poller()
        # Building a policy initialises its parameters, XLA work that can outlast a heartbeat
        # timeout on a loaded CPU with a cold compilation cache: busy time, as the server's.
        with self.busy("building the policies it evaluates"):
            for group in self.groups:
                for name in group.names:
                    spec = policy_spec(self.config, name)
                    runner = make_runner(self.config, spec, self.config.seed, 1, 1)
                    policy, _ = make_policy(self.config, spec)
                    group.runners.append(runner)
                    group.team.append(TrainedPolicy(self.config, spec, policy, runner.params,
                                                    step=0))
        for group in self.groups:
            for name, runner in zip(group.names, group.runners, strict=True):
                self.subscribers.append(subscribe(self, runner, name))
                self.poller.register(self.subscribers[-1].socket, zmq.POLLIN)
                root = evaluated_root(self.run_dir, name, self.config.checkpoint.dir)
                if saved := steps_in(root):  # a restarted evaluator
                    group.best[name] = step_meta(root, saved[-1])["eval_return_mean"]
        self.env = make_team_split(env, self.config.seed) if self.multi_agent else None
        self.envs = [] if self.multi_agent else [make_env(env)
                                                 for _ in range(self.config.evaluation.episodes)]
        """A single-agent policy plays its episodes in lockstep, one env each."""

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

    def _play(self, group: _Group, seeds: list[int]) -> list[TeamEpisode] | None:
        """The episodes from `seeds`; None if the worker was told to stop meanwhile."""
        if self.env is not None:  # multi-agent
            played = []
            for seed in seeds:
                played.append(play_team_episode(group.team, self.env, seed, deterministic=True,
                                                on_step=self.keep_alive))
                if self.stopping:
                    return None
            return played
        returns = play_episodes(group.team[0], self.envs, seeds, deterministic=True,
                                on_step=self.keep_alive)
        return None if returns is None else [
            TeamEpisode({group.names[0]: total}, total, total, length)
            for total, length in returns]

    def _evaluate(self, group: _Group, version: int) -> None:
        """Play the episodes with a snapshot of the group's policies; `version`: the oldest
        of theirs (the only one of a single policy)."""
        cfg = self.config.evaluation
        versions = [runner.version for runner in group.runners]
        for trained, runner in zip(group.team, group.runners, strict=True):
            trained.params = runner.params  # stays on the device, a snapshot
        episodes = self._play(group, [  # the same starts every time: comparable figures
            env_seed(self.config.seed, EVALUATOR_ACTOR_INDEX, episode)
            for episode in range(cfg.episodes)])
        if episodes is None or self.stopping:
            return  # a cut episode is no evaluation
        self.episodes += len(episodes)
        meta: dict[str, Any] = {"eval_policy_version": version, "episodes": len(episodes),
                                "config": config_to_dict(self.config)}
        if self.multi_agent:
            meta["team_eval_return_mean"] = float(np.mean([e.team_return for e in episodes]))
        location = self.config.checkpoint.dir
        keep_best(group.best, [
            Evaluated(name, own, trained.params, [e.returns[name] for e in episodes])
            for name, trained, own in zip(group.names, group.team, versions, strict=True)],
            lambda name: evaluated_root(self.run_dir, name, location), meta)
        group.episodes.extend(episodes)
        self.evaluations += 1
        group.eval_version = version
        group.versions = dict(zip(group.names, versions, strict=True))
        group.next_version = version + cfg.every_updates
        self.log.info("%sversion %d: return %.1f over %d deterministic episodes%s",
                      f"{group.label} " if group.label else "", version,
                      np.mean([e.agent_mean for e in episodes]), len(episodes),
                      "".join(f", {name} {np.mean([e.returns[name] for e in episodes]):.1f}"
                              for name in group.names) if self.multi_agent else "")

    def counters(self) -> dict[str, float]:
        own = {f"eval_version/{name}": version for g in self.groups
               for name, version in g.versions.items()} if self.multi_agent else {}
        return {"evaluations": self.evaluations, "eval_episodes": self.episodes,
                **{_labelled("eval_version", g.label): g.eval_version for g in self.groups},
                **own, **device_memory_counters()}

    def stats_arrays(self) -> dict[str, np.ndarray]:
        """`eval_return` (`eval_return/<member>` in a population); in a multi-agent run
        also `team_eval_return` and each policy's own `eval_return/<policy>`."""
        arrays = {}
        for group in self.groups:
            episodes, group.episodes = group.episodes, []
            arrays[_labelled("eval_return", group.label)] = np.asarray(
                [e.agent_mean for e in episodes], np.float32)
            if self.multi_agent:
                arrays[TEAM_EVAL_RETURN] = np.asarray([e.team_return for e in episodes],
                                                      np.float32)
                for name in group.names:
                    arrays[f"eval_return/{name}"] = np.asarray(
                        [e.returns[name] for e in episodes], np.float32)
        return arrays

    def close(self) -> None:
        for env in [getattr(self, "env", None), *getattr(self, "envs", [])]:
            if env is not None:
                env.close()
        for subscriber in getattr(self, "subscribers", []):
            subscriber.socket.close()


def _labelled(key: str, label: str) -> str:
    """A group's counter or array: `eval_return`, or `eval_return/<member>`."""
    return f"{key}/{label}" if label else key
