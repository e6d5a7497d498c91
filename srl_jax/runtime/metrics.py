"""Metrics: fold workers' heartbeats into rows of metrics.jsonl and a progress line.

Workers send cumulative counters; the aggregator keeps the latest per worker,
adds the last counters of workers that were restarted (so totals never go
back), and turns differences between rows into rates and time fractions.
Row keys the README lists under "The run directory" never change; extra keys are
grouped by prefix (`actor/`, `inference/`, `learner/`, `replay/`, `policy/`,
`system/`). In a multi-agent run `episode_return_mean` is the mean of every agent's
own return (so that nothing ranks by the team sum unasked: in a competitive game the
sum says who won, not how well each side plays), `team_return_mean` the team return
(all agents' rewards summed) and `policy/<name>/episode_return_mean` the mean return
of one of that policy's agents; `eval_return_mean`, `team_eval_return_mean` and
`policy/<name>/eval_return_mean` are the evaluator's counterparts.
`episode_return_mean_last<N>` (N in RETURN_WINDOWS) is the mean over the last N
episodes the controller received, whichever rows they came in (likewise
`team_return_mean_last<N>`).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict, deque
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.core.metrics_table import (
    CARRIED,
    DEVICE_KINDS,
    DEVICE_MEMORY,
    GAUGES,
    MEMBER_EVAL,
    OPPONENT_VERSION,
    POLICY_RETURN,
    REPLAY_LEVELS,
    RETURN_WINDOWS,
    TEAM_EVAL_RETURN,
    TEAM_RETURN,
    recent_return_means,
)


def _is_held(key: str) -> bool:
    """Kept as last seen when a worker dies, until its successor reports anew."""
    return key in GAUGES or key in CARRIED or key.startswith(("train/", "eval_version/"))


class MetricsAggregator:
    """Totals and windowed rates over every worker's latest heartbeat.

    A resumed run passes where its metrics stopped (`env_frames_base`,
    `time_base`, `restarts`), so totals continue instead of starting at zero.
    """

    def __init__(self, env_frames_base: float = 0.0, time_base: float = 0.0,
                 restarts: int = 0) -> None:
        self.env_frames_base = env_frames_base
        self.live: dict[str, dict[str, float]] = {}
        self.kinds: dict[str, str] = {}
        self.policies: dict[str, str] = {}
        self._policy_returns: dict[str, list[np.ndarray]] = defaultdict(list)
        self._opponents: dict[str, list[np.ndarray]] = defaultdict(list)
        self.retired: dict[str, float] = defaultdict(float)
        self._returns: list[np.ndarray] = []
        self._recent_returns: deque[float] = deque(maxlen=max(RETURN_WINDOWS))
        self._team_returns: list[np.ndarray] = []
        self._recent_team: deque[float] = deque(maxlen=max(RETURN_WINDOWS))
        self._team_evals: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._eval_returns: list[np.ndarray] = []
        self._member_evals: dict[str, list[np.ndarray]] = defaultdict(list)
        self._previous: dict[str, float] = {"env_frames": env_frames_base}
        self._previous_time = time_base
        self.restarts = restarts
        self.learner_restarts = 0

    def observe(self, worker: str, kind: str, counters: dict[str, Any],
                arrays: dict[str, np.ndarray], first: bool = False,
                policy: str = DEFAULT_POLICY) -> None:
        """Take one heartbeat; `first` marks a new process's first report.

        A new learner brings the run counters it restored from a checkpoint;
        the jump is history, not this window's work, so rates skip it.
        """
        carried = [key for key in CARRIED if key in counters] if first else []
        before = {key: self.total(kind, key) for key in carried}
        self.live[worker] = {k: float(v) for k, v in counters.items()
                             if isinstance(v, int | float) and math.isfinite(v)}
        self.kinds[worker] = kind
        self.policies[worker] = policy
        for key in carried:
            window_key = f"{kind}:{key}"
            self._previous[window_key] = self._previous.get(window_key, 0.0) + \
                self.total(kind, key) - before[key]
        if "episode_return" in arrays and "episode_length" in arrays:
            self._returns.append(np.asarray(arrays["episode_return"], np.float64))
            self._lengths.append(np.asarray(arrays["episode_length"], np.float64))
        if TEAM_RETURN in arrays:
            self._team_returns.append(np.asarray(arrays[TEAM_RETURN], np.float64))
        if TEAM_EVAL_RETURN in arrays:
            self._team_evals.append(np.asarray(arrays[TEAM_EVAL_RETURN], np.float64))
        for name, values in arrays.items():
            if name.startswith(POLICY_RETURN):  # a multi-agent actor's per-agent returns
                self._policy_returns[name[len(POLICY_RETURN):]].append(
                    np.asarray(values, np.float64))
            elif name.startswith(OPPONENT_VERSION):
                self._opponents[name[len(OPPONENT_VERSION):]].append(np.asarray(values))
        if "eval_return" in arrays:
            self._eval_returns.append(np.asarray(arrays["eval_return"], np.float64))
        for name, values in arrays.items():
            if name.startswith(MEMBER_EVAL):
                self._member_evals[name[len(MEMBER_EVAL):]].append(
                    np.asarray(values, np.float64))

    def retire(self, worker: str) -> None:
        """A worker died: keep its cumulative counters in the totals.

        Gauges and run counters stay as last seen until the successor's first
        heartbeat replaces them, so rows never drop to zero in between.
        """
        held = {}
        for key, value in self.live.get(worker, {}).items():
            if _is_held(key):
                held[key] = value
            elif key in DEVICE_MEMORY or (self.kinds[worker] == "replay"
                                          and key in REPLAY_LEVELS):
                continue
            else:
                self.retired[f"{self.kinds[worker]}:{key}"] += value
                self.retired[f"{self.kinds[worker]}:{key}:{self.policies[worker]}"] += value
        if worker in self.live:
            self.live[worker] = held

    def total(self, kind: str, key: str, policy: str | None = None) -> float:
        """`key` summed over `kind`'s workers (of `policy`), those retired included."""
        live = sum(c.get(key, 0.0) for w, c in self.live.items()
                   if self.kinds[w] == kind and policy in (None, self.policies[w]))
        retired = f"{kind}:{key}" if policy is None else f"{kind}:{key}:{policy}"
        return live + self.retired.get(retired, 0.0)

    def gauge(self, kind: str, key: str, policy: str | None = None) -> float | None:
        """The largest current value of `key` over `kind`'s workers (of `policy`)."""
        values = [c[key] for w, c in self.live.items() if self.kinds[w] == kind and key in c
                  and policy in (None, self.policies[w])]
        return max(values) if values else None

    def row(self, elapsed: float) -> dict[str, Any]:
        """One metrics row over the window since the previous row."""
        totals = {
            "env_frames": self.env_frames_base + self.total("actor", "env_frames"),
            **{f"actor:{k}": self.total("actor", k) for k in (
                "time_env", "time_wait", "time_send", "chunks_sent", "chunks_dropped",
                "infer_timeouts")},
            **{f"inference:{k}": self.total("inference", k) for k in (
                "requests", "rows", "batches", "padded_rows", "time_compute")},
            **{f"learner:{k}": self.total("learner", k) for k in (
                "frames_consumed", "lag_sum", "lag_count", "time_update", "time_publish",
                "time_checkpoint")},
            **{f"replay:{k}": self.total("replay", k) for k in (
                "inserted", "sampled", "time_insert_wait", "time_sample_wait")},
        }
        delta = {k: v - self._previous.get(k, 0.0) for k, v in totals.items()}
        window = max(elapsed - self._previous_time, 1e-9)
        self._previous, self._previous_time = totals, elapsed
        actors = max(1, sum(1 for k in self.kinds.values() if k == "actor"))
        servers = max(1, sum(1 for k in self.kinds.values() if k == "inference"))
        version = self.gauge("learner", "policy_version") or 0
        checkpoint_step = self.gauge("learner", "checkpoint_step")
        row: dict[str, Any] = {
            "time": round(elapsed, 3),
            "env_frames": int(totals["env_frames"]),
            "fps": round(delta["env_frames"] / window, 1),
            "learner_steps": int(version),
            "policy_version": int(version),
            "samples_dropped_stale": int(self.total("learner", "samples_dropped_stale")),
        }
        if self._returns:
            returns, lengths = np.concatenate(self._returns), np.concatenate(self._lengths)
            self._returns, self._lengths = [], []
            if len(returns):
                row["episode_return_mean"] = round(float(returns.mean()), 3)
                row["episode_length_mean"] = round(float(lengths.mean()), 3)
                row["episodes"] = len(returns)
                self._recent_returns.extend(returns.tolist())
        row.update(recent_return_means(list(self._recent_returns)))
        self._team_rows(row)
        evaluated = np.concatenate(self._eval_returns) if self._eval_returns else np.empty(0)
        self._eval_returns = []
        if len(evaluated):  # deterministic episodes of the evaluator, apart from training
            row["eval_return_mean"] = round(float(evaluated.mean()), 3)
            row["eval_policy_version"] = int(self.gauge("evaluator", "eval_version") or 0)
        if delta["learner:lag_count"] > 0:
            row["policy_lag_mean"] = round(delta["learner:lag_sum"] / delta["learner:lag_count"],
                                           3)
        actor_time = window * actors
        for part in ("env", "wait", "send"):
            row[f"actor/time_{part}_frac"] = round(delta[f"actor:time_{part}"] / actor_time, 4)
        row["actor/chunks_dropped"] = int(totals["actor:chunks_dropped"])
        row["actor/infer_timeouts"] = int(totals["actor:infer_timeouts"])
        if delta["inference:batches"] > 0:
            row["inference/batch_rows_mean"] = round(
                delta["inference:rows"] / delta["inference:batches"], 2)
            row["inference/requests_per_batch"] = round(
                delta["inference:requests"] / delta["inference:batches"], 2)
            row["inference/pad_frac"] = round(
                1 - delta["inference:rows"] / max(delta["inference:padded_rows"], 1), 4)
        row["inference/time_compute_frac"] = round(
            delta["inference:time_compute"] / (window * servers), 4)
        row["learner/samples_per_s"] = round(delta["learner:frames_consumed"] / window, 1)
        row["learner/time_update_frac"] = round(delta["learner:time_update"] / window, 4)
        row["learner/samples_dropped_full"] = int(self.total("learner", "samples_dropped_full"))
        row["learner/queue_chunks"] = int(self.gauge("learner", "queue_chunks") or 0)
        if checkpoint_step is not None and checkpoint_step >= 0:
            row["learner/checkpoint_step"] = int(checkpoint_step)
        row["learner/time_checkpoint_frac"] = round(delta["learner:time_checkpoint"] / window, 4)
        for worker, counters in self.live.items():
            if self.kinds[worker] == "learner":
                policy = self.policies[worker]
                prefix = "learner" if policy == DEFAULT_POLICY else f"learner/{policy}"
                for key, value in counters.items():
                    if key.startswith("train/"):
                        row[f"{prefix}/{key[len('train/'):]}"] = round(value, 6)
        self._replay_rows(row, delta, window)
        self._device_rows(row)
        if "population" in self.kinds.values():
            row["population/exploits"] = int(self.gauge("population", "exploits") or 0)
        self._policy_rows(row)
        row["system/restarts"] = self.restarts
        row["system/learner_restarts"] = self.learner_restarts
        for counter in ("wire_rejected", "auth_refused"):
            row[f"system/{counter}"] = int(sum(
                self.total(kind, counter) for kind in set(self.kinds.values())))
        return row


    def _team_rows(self, row: dict[str, Any]) -> None:
        """`team_return_mean` (with its windows) and `team_eval_return_mean`: a multi-agent
        run's team returns, all agents' rewards summed."""
        team = np.concatenate(self._team_returns) if self._team_returns else np.empty(0)
        evaluated = np.concatenate(self._team_evals) if self._team_evals else np.empty(0)
        self._team_returns, self._team_evals = [], []
        if len(team):
            row["team_return_mean"] = round(float(team.mean()), 3)
            self._recent_team.extend(team.tolist())
        row.update(recent_return_means(list(self._recent_team), key="team_return_mean"))
        if len(evaluated):
            row["team_eval_return_mean"] = round(float(evaluated.mean()), 3)

    def _replay_rows(self, row: dict[str, Any], delta: dict[str, float],
                     window: float) -> None:
        """`replay/...`: the replay servers' contents, rates, waits and memory, summed
        over servers (priorities: the mean of their means, the largest maximum)."""
        servers = [c for w, c in self.live.items() if self.kinds[w] == "replay"]
        if not servers:
            return
        row["replay/size"] = int(sum(c.get("size", 0) for c in servers))
        row["replay/inserts_per_s"] = round(delta["replay:inserted"] / window, 1)
        row["replay/samples_per_s"] = round(delta["replay:sampled"] / window, 1)
        for side in ("insert", "sample"):  # counters come at the servers' own pace: a
            # window's delta of a wait that spans it can exceed the window by a report's lag
            row[f"replay/{side}_wait_frac"] = round(min(
                1.0, delta[f"replay:time_{side}_wait"] / (window * len(servers))), 4)
        row["replay/memory_mb"] = round(sum(c.get("storage_mb", 0) for c in servers), 1)
        row["replay/rss_mb"] = round(sum(c.get("rss_mb", 0) for c in servers), 1)
        means = [c["priority_mean"] for c in servers if "priority_mean" in c]
        if means:
            row["replay/priority_mean"] = round(float(np.mean(means)), 6)
            row["replay/priority_max"] = round(max(c.get("priority_max", 0) for c in servers), 6)
        row["replay/priorities_stale"] = int(self.total("replay", "priorities_stale"))
        row["learner/replay_timeouts"] = int(self.total("learner", "replay_timeouts"))

    def _device_rows(self, row: dict[str, Any]) -> None:
        """`<kind>/device_memory_mib` and `..._peak_mib`: summed over the kind's live
        workers that report device memory (GPUs and TPUs do; the CPU does not)."""
        for kind in DEVICE_KINDS:
            for key in DEVICE_MEMORY:
                values = [c[key] for w, c in self.live.items()
                          if self.kinds[w] == kind and key in c]
                if values:
                    row[f"{kind}/{key}"] = round(sum(values), 1)

    def _policy_rows(self, row: dict[str, Any]) -> None:
        """`policy/<name>/...`: each policy's version and newest checkpoint step, its
        agents' mean return and, for a frozen policy playing an opponent pool, the mean,
        least and greatest snapshot version its episodes begun in the window play."""
        learners = {self.policies[w] for w, kind in self.kinds.items() if kind == "learner"}
        if learners != {DEFAULT_POLICY}:
            for policy in sorted(learners):
                version = self.gauge("learner", "policy_version", policy)
                if version is not None:
                    row[f"policy/{policy}/policy_version"] = int(version)
                saved = self.gauge("learner", "checkpoint_step", policy)
                if saved is not None and saved >= 0:
                    row[f"policy/{policy}/checkpoint_step"] = int(saved)
        members = {self.policies[w] for w, kind in self.kinds.items() if kind == "actor"}
        if members != {DEFAULT_POLICY}:  # a population: each member's actors are its own
            for member in sorted(members):
                row[f"policy/{member}/env_frames"] = int(
                    self.total("actor", "env_frames", member))
        for policy, chunks in sorted(self._policy_returns.items()):
            returns = np.concatenate(chunks)
            if len(returns):
                row[f"policy/{policy}/episode_return_mean"] = round(float(returns.mean()), 3)
        self._policy_returns.clear()
        for policy, chunks in sorted(self._opponents.items()):
            versions = np.concatenate(chunks)
            if len(versions):
                row[f"policy/{policy}/opponent_version_mean"] = round(float(versions.mean()), 3)
                row[f"policy/{policy}/opponent_version_min"] = int(versions.min())
                row[f"policy/{policy}/opponent_version_max"] = int(versions.max())
        self._opponents.clear()
        for member, chunks in sorted(self._member_evals.items()):
            returns = np.concatenate(chunks)
            if len(returns):
                row[f"policy/{member}/eval_return_mean"] = round(float(returns.mean()), 3)
                row[f"policy/{member}/eval_policy_version"] = int(
                    self.gauge("evaluator", f"eval_version/{member}") or 0)
        self._member_evals.clear()


def tensorboard_tag(key: str) -> str | None:
    """The TensorBoard name of a metrics key: grouped keys keep their group, the
    contract keys go under `train/`; `time` is the event's wall time instead."""
    if key == "time":
        return None
    return key if "/" in key else f"train/{key}"


class MetricsWriter:
    """Appends rows to metrics.jsonl (flushed per row so a reader never waits) and
    to TensorBoard event files in the run directory, with env frames as the step."""

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self._file = open(Path(run_dir) / "metrics.jsonl", "a")  # noqa: SIM115 - held for the run
        self._events = SummaryWriter(str(run_dir), flush_secs=5)

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for key, value in row.items():
            tag = tensorboard_tag(key)
            if tag is not None and isinstance(value, int | float):
                self._events.add_scalar(tag, value, global_step=row["env_frames"])

    def close(self) -> None:
        self._file.close()
        self._events.close()


def _si(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def progress_line(row: dict[str, Any]) -> str:
    """The one-line live summary shown in the terminal."""
    parts = [f"{row['time']:6.1f}s", f"frames {_si(row['env_frames'])}",
             f"fps {_si(row['fps'])}", f"updates {row['learner_steps']}"]
    if "episode_return_mean" in row:
        parts.append(f"return {row['episode_return_mean']:.1f}")
    if "policy_lag_mean" in row:
        parts.append(f"lag {row['policy_lag_mean']:.2f}")
    if row.get("system/restarts"):
        parts.append(f"restarts {row['system/restarts']}")
    return " | ".join(parts)


class ProgressDisplay:
    """Rewrites one terminal line; on a non-terminal prints a line every few seconds."""

    def __init__(self, stream: TextIO, enabled: bool = True, plain_every_s: float = 5.0) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = stream.isatty()
        self.plain_every_s = plain_every_s
        self._last_plain = -math.inf

    def show(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = progress_line(row)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
        elif row["time"] - self._last_plain >= self.plain_every_s:
            self._last_plain = row["time"]
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self, message: str, ok: bool = True) -> None:
        """End the live line; the closing message goes to stderr when the run failed."""
        if self.tty and self.enabled:
            self.stream.write("\n")
            self.stream.flush()
        out = self.stream if ok else sys.stderr
        out.write(message + "\n")
        out.flush()
