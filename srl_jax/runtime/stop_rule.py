"""The run's stop condition (`stop` in the config), read from each metrics row.

A run ends at a return target, a frame limit or a wall-time limit, whichever comes
first. Whose return the targets read: the run's one return; in a population, every
member's own; in a multi-agent run, every trained policy's own (or `stop.policy`'s).
"""

from __future__ import annotations

from typing import Any

from srl_jax.config.env_families import family_of
from srl_jax.config.schema import ExperimentConfig, member_names, run_policies


class StopRule:
    """Says why a run ends at a row, or nothing while it goes on."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.stop = config.stop
        self.targets = self._target_policies(config)
        self._latest: dict[str, dict[str, float]] = {}
        """Each policy's (population member's) latest value of each stop metric, by metric."""

    @staticmethod
    def _target_policies(config: ExperimentConfig) -> tuple[list[str], str] | None:
        """Whose own returns the targets read, and how the stop reason names them: a
        population's members, or a multi-agent run's trained policies (`stop.policy` alone when
        set); None: the run's one return (`episode_return_mean`, `eval_return_mean`)."""
        if members := member_names(config.population.members):
            return members, "every member's"
        if not family_of(config.env).multi_agent:
            return None
        if (chosen := config.stop.policy) is not None:
            return [chosen], f"policy {chosen}'s"
        return run_policies(config), "every trained policy's"  # frozen ones only act

    def reason(self, row: dict[str, Any]) -> str | None:
        """Why the run ends at `row` (one line), or None."""
        stop = self.stop
        if self.targets is not None:
            if reason := self._policy_target(row, *self.targets):
                return reason
        elif stop.target_return is not None and row.get(
                "episode_return_mean", -float("inf")) >= stop.target_return:
            return (f"episode_return_mean {row['episode_return_mean']:.1f} reached the "
                    f"target {stop.target_return:g} at {row['env_frames']} frames, "
                    f"{row['time']:.1f}s")
        elif stop.target_eval_return is not None and row.get(
                "eval_return_mean", -float("inf")) >= stop.target_eval_return:
            return (f"eval_return_mean {row['eval_return_mean']:.1f} of version "
                    f"{row['eval_policy_version']} reached the target "
                    f"{stop.target_eval_return:g} at {row['env_frames']} frames, "
                    f"{row['time']:.1f}s")
        if stop.env_frames and row["env_frames"] >= stop.env_frames:
            return f"{row['env_frames']} env frames reached the limit {stop.env_frames}"
        if stop.wall_time_s and row["time"] >= stop.wall_time_s:
            return f"wall time {row['time']:.0f}s reached the limit {stop.wall_time_s:g}s"
        return None

    def _lowest(self, row: dict[str, Any], metric: str, names: list[str]) -> float:
        """Progress of policies `names` in `metric`: the lowest of their latest
        `policy/<name>/<metric>` (-inf until every one has one)."""
        latest = self._latest.setdefault(metric, {})
        for name in names:
            if (key := f"policy/{name}/{metric}") in row:
                latest[name] = row[key]
        if len(latest) < len(names):
            return -float("inf")
        return min(latest.values())

    def _policy_target(self, row: dict[str, Any], names: list[str], whose: str) -> str | None:
        """Why a run ends on a target that policies `names` read with their own returns
        (or evaluation returns): each one's reached it."""
        for metric, target in (("episode_return_mean", self.stop.target_return),
                               ("eval_return_mean", self.stop.target_eval_return)):
            if target is not None and (lowest := self._lowest(row, metric, names)) >= target:
                figure = f"lowest {lowest:.1f}" if len(names) > 1 else f"{lowest:.1f}"
                return (f"{whose} {metric} reached the target {target:g} ({figure}) at "
                        f"{row['env_frames']} frames, {row['time']:.1f}s")
        return None
