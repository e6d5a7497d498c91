"""Metric names and the pure helpers every worker kind shares: what a heartbeat's
counters and arrays are called, which of them are levels, which a run carries across
restarts, and how multi-agent returns are counted (srl_jax/runtime/metrics.py folds
them into rows)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GAUGES = frozenset({"policy_version", "learner_steps", "queue_chunks", "checkpoint_step",
                    "eval_version"})
CARRIED = frozenset({"frames_consumed", "frames_received", "episodes_received", "lag_sum",
                     "lag_count", "samples_dropped_stale", "samples_dropped_full"})
"""Learner counters that belong to the run: checkpointed, and restored by a new learner."""
REPLAY_LEVELS = frozenset({"size", "storage_mb", "rss_mb", "pending_requests",
                           "priority_min", "priority_max", "priority_mean"})
"""A replay server's current levels: they die with it (its contents are lost), so a
dead server's are neither held nor added to the totals."""
DEVICE_MEMORY = ("device_memory_mib", "device_memory_peak_mib")
"""A JAX worker's device memory in use and its peak (summed over its devices), where the
platform reports them: levels of the live process, never added to the totals."""
DEVICE_KINDS = ("learner", "inference", "evaluator")
POLICY_RETURN = "policy_return/"
"""Heartbeat arrays `policy_return/<policy>`: single agents' episode returns, per policy."""
OPPONENT_VERSION = "opponent_version/"
"""Heartbeat arrays `opponent_version/<policy>` of a frozen policy that plays an opponent
pool (self-play): the snapshot version each episode played, one per episode begun."""
TEAM_RETURN = "team_return"
"""Heartbeat array of a multi-agent actor: each episode's team return (all agents'
rewards summed); its `episode_return` holds the same episodes' `agent_mean_returns`."""
TEAM_EVAL_RETURN = "team_eval_return"
"""The evaluator's counterpart of TEAM_RETURN, beside its `eval_return`."""


RETURN_WINDOWS = (20, 100)
"""Episode counts of the rolling return means in every row: 100 is Sample Factory's
`--stats_avg`, 20 the window bench/compare.py reads the single-process baseline with."""


def agent_mean_returns(team_returns: Sequence[float], agents: int) -> list[float]:
    """A multi-agent env's episodes as `episode_return` counts them: the mean of the
    episode's `agents` agents' own returns, its team return divided among them."""
    return [float(team) / agents for team in team_returns]


def recent_return_means(recent: Sequence[float], windows: Sequence[int] = RETURN_WINDOWS,
                        key: str = "episode_return_mean") -> dict[str, float]:
    """`<key>_last<N>`: the mean of the last N returns of `recent` (all of
    them while fewer than N have finished, as Sample Factory counts), for each N.

    A row's `episode_return_mean` averages however many episodes ended in its second; a
    fixed count of episodes is the window a peer's time to a target is read with.
    """
    if not len(recent):
        return {}
    returns = np.asarray(recent, np.float64)
    return {f"{key}_last{n}": round(float(returns[-n:].mean()), 3) for n in windows}


MEMBER_EVAL = "eval_return/"
"""Heartbeat arrays `eval_return/<member>` (and gauges `eval_version/<member>`): a
population member's evaluation returns, evaluated apart from the other members."""
