"""Episode rows: the heartbeat arrays of finished episodes, folded into a metrics row.

Actors send the returns and lengths of the episodes they finished since their last
heartbeat, the evaluator its evaluation returns. A row shows the means over the
episodes that arrived in its window, and rolling means over the last N episodes
whichever rows they came in. In a multi-agent run `episode_return_mean` is the mean of
every agent's own return (so that nothing ranks by the team sum unasked: in a
competitive game the sum says who won, not how well each side plays),
`team_return_mean` the team return (all agents' rewards summed) and
`policy/<name>/episode_return_mean` the mean return of one of that policy's agents;
`eval_return_mean`, `team_eval_return_mean` and `policy/<name>/eval_return_mean` are
the evaluator's counterparts. Where the env says who won (SMAX), `win_rate` is the share
of the window's episodes that were won, with rolling means as the returns have. The row
keys are listed in `srl_jax.dataflow.metrics_table.OTHER_ROWS`.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from srl_jax.dataflow.metrics_table import (
    EPISODE_WIN,
    MEMBER_EVAL,
    OPPONENT_VERSION,
    POLICY_RETURN,
    RETURN_WINDOWS,
    TEAM_EVAL_RETURN,
    TEAM_RETURN,
    recent_return_means,
)


def _mean(chunks: list[np.ndarray]) -> float | None:
    """The mean of the arrays' values together (None when there are none)."""
    values = np.concatenate(chunks) if chunks else np.empty(0)
    return round(float(values.mean()), 3) if len(values) else None


class EpisodeRows:
    """The episodes of the current window, and the last returns the rolling means read."""

    def __init__(self) -> None:
        self._returns: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._team: list[np.ndarray] = []
        self._wins: list[np.ndarray] = []
        self._evals: list[np.ndarray] = []
        self._team_evals: list[np.ndarray] = []
        self._policy_returns: dict[str, list[np.ndarray]] = defaultdict(list)
        self._opponents: dict[str, list[np.ndarray]] = defaultdict(list)
        self._member_evals: dict[str, list[np.ndarray]] = defaultdict(list)
        self._recent: deque[float] = deque(maxlen=max(RETURN_WINDOWS))
        self._recent_team: deque[float] = deque(maxlen=max(RETURN_WINDOWS))
        self._recent_wins: deque[float] = deque(maxlen=max(RETURN_WINDOWS))

    def observe(self, arrays: dict[str, np.ndarray]) -> None:
        """Take one heartbeat's arrays (`episode_return` and `episode_length` come together)."""
        if "episode_return" in arrays and "episode_length" in arrays:
            self._returns.append(np.asarray(arrays["episode_return"], np.float64))
            self._lengths.append(np.asarray(arrays["episode_length"], np.float64))
        for name, into in ((TEAM_RETURN, self._team), (EPISODE_WIN, self._wins),
                           ("eval_return", self._evals),
                           (TEAM_EVAL_RETURN, self._team_evals)):
            if name in arrays:
                into.append(np.asarray(arrays[name], np.float64))
        for name, values in arrays.items():
            for prefix, by_name in ((POLICY_RETURN, self._policy_returns),
                                    (MEMBER_EVAL, self._member_evals)):
                if name.startswith(prefix):
                    by_name[name[len(prefix):]].append(np.asarray(values, np.float64))
            if name.startswith(OPPONENT_VERSION):
                self._opponents[name[len(OPPONENT_VERSION):]].append(np.asarray(values))

    def add_rows(self, row: dict[str, Any], eval_version: Callable[[str], float | None]) -> None:
        """Add the window's episode keys to `row` and start the next window;
        `eval_version(counter)` is the evaluator's gauge of that name."""
        self._training_rows(row)
        if (evaluated := _mean(self._evals)) is not None:  # deterministic, apart from training
            row["eval_return_mean"] = evaluated
            row["eval_policy_version"] = int(eval_version("eval_version") or 0)
        if (team_evaluated := _mean(self._team_evals)) is not None:
            row["team_eval_return_mean"] = team_evaluated
        for policy, chunks in sorted(self._policy_returns.items()):
            if (mean := _mean(chunks)) is not None:
                row[f"policy/{policy}/episode_return_mean"] = mean
        for policy, chunks in sorted(self._opponents.items()):
            versions = np.concatenate(chunks)
            if len(versions):
                row[f"policy/{policy}/opponent_version_mean"] = round(float(versions.mean()), 3)
                row[f"policy/{policy}/opponent_version_min"] = int(versions.min())
                row[f"policy/{policy}/opponent_version_max"] = int(versions.max())
        for member, chunks in sorted(self._member_evals.items()):
            if (mean := _mean(chunks)) is not None:
                row[f"policy/{member}/eval_return_mean"] = mean
                row[f"policy/{member}/eval_policy_version"] = int(
                    eval_version(f"eval_version/{member}") or 0)
        self._evals, self._team_evals = [], []
        self._policy_returns.clear()
        self._opponents.clear()
        self._member_evals.clear()

    def _training_rows(self, row: dict[str, Any]) -> None:
        """`episode_return_mean`, `episode_length_mean`, `episodes`, `team_return_mean`,
        `win_rate`, and the rolling means of the returns, team returns and wins."""
        if self._returns:
            returns, lengths = np.concatenate(self._returns), np.concatenate(self._lengths)
            if len(returns):
                row["episode_return_mean"] = round(float(returns.mean()), 3)
                row["episode_length_mean"] = round(float(lengths.mean()), 3)
                row["episodes"] = len(returns)
                self._recent.extend(returns.tolist())
        row.update(recent_return_means(list(self._recent)))
        team = np.concatenate(self._team) if self._team else np.empty(0)
        if len(team):
            row["team_return_mean"] = round(float(team.mean()), 3)
            self._recent_team.extend(team.tolist())
        row.update(recent_return_means(list(self._recent_team), key="team_return_mean"))
        if (won := _mean(self._wins)) is not None:
            row["win_rate"] = won
            self._recent_wins.extend(np.concatenate(self._wins).tolist())
        row.update(recent_return_means(list(self._recent_wins), key="win_rate"))
        self._returns, self._lengths, self._team, self._wins = [], [], [], []
