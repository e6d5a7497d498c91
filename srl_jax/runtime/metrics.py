"""Metrics: fold workers' heartbeats into rows of metrics.jsonl and a progress line.

Workers send cumulative counters; the aggregator keeps the latest per worker,
adds the last counters of workers that were restarted (so totals never go
back), and turns differences between rows into rates and time fractions. Which
counters become which row keys, and how, is the metrics table each worker kind
declares (srl_jax/dataflow/metrics_table.py): this module reads it and knows no counter
by name. Row keys docs/metrics.md lists as always there never change; extra keys
are grouped by prefix (`actor/`, `inference/`, `learner/`, `replay/`, `policy/`,
`system/`). The episode keys come from the heartbeat arrays (srl_jax/runtime/episodes.py).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.metrics_table import (
    COMMON,
    CONTRACT_KEYS,
    POLICY,
    SHOWN_ALWAYS,
    Aggregate,
    Counter,
    Row,
    Shown,
)
from srl_jax.dataflow.worker_kinds import KINDS
from srl_jax.runtime.episodes import EpisodeRows

log = logging.getLogger("metrics")

HELD = (Aggregate.MAX, Aggregate.CARRIED, Aggregate.PER_POLICY)
"""Kept as last seen when a worker dies, until its successor reports anew."""
WINDOWED = (Shown.RATE, Shown.FRACTION, Shown.SHARE, Shown.RATIO, Shown.SPARE)
"""Shown by their rise over the window since the previous row."""


def own_counters(kind: str) -> tuple[Counter, ...]:
    """The counters `kind` declares (none for a kind no module registered)."""
    known = KINDS.get(kind)
    return known.counters if known is not None else ()


def declared(kind: str) -> tuple[Counter, ...]:
    """The counters `kind` declares, and those every worker sends."""
    return own_counters(kind) + COMMON


def _rounded(value: float, row: Row) -> float | int:
    if row.at_most is not None:
        value = min(row.at_most, value)
    return int(value) if row.decimals == 0 else round(value, row.decimals)


NUMBERS = (int, float, bool)
"""The types a counter's value may have (by `type`, cheaper than isinstance per counter of
every heartbeat)."""


@dataclass
class _Offered:
    """A worker's heartbeats that `MetricsAggregator.offer` keeps for the next row."""

    kind: str
    counters: dict[str, Any]
    arrays: list[dict[str, np.ndarray]]
    first: bool
    policy: str


class MetricsAggregator:
    """Totals and windowed rates over every worker's latest heartbeat.

    A resumed run passes where its metrics stopped (`env_frames_base`,
    `time_base`, `restarts`), so totals continue instead of starting at zero.
    """

    def __init__(self, env_frames_base: float = 0.0, time_base: float = 0.0,
                 restarts: int = 0) -> None:
        self.bases = {"actor:env_frames": env_frames_base}
        """Totals a resumed run starts from, by `kind:counter`."""
        self.live: dict[str, dict[str, float]] = {}
        self.kinds: dict[str, str] = {}
        self.policies: dict[str, str] = {}
        self.retired: dict[str, float] = defaultdict(float)
        self.episodes = EpisodeRows()
        self._previous: dict[str, float] = dict(self.bases)
        self._previous_time = time_base
        self._aggregates: dict[tuple[str, str], Aggregate] = {}
        self.restarts = restarts
        self.learner_restarts = 0
        self._offered: dict[str, _Offered] = {}
        self._sums: dict[tuple[str, str | None], dict[str, float]] = defaultdict(dict)
        """Every live counter summed by (kind, None) and (kind, policy), then key, moved as
        each worker's counters change (`_set_live`): a row asks for hundreds of totals over
        thousands of workers, and a pass over all of them each row was most of its cost.
        Counters of whole numbers (frames, steps) sum exactly, as floats below 2^53 do."""

    def aggregate(self, kind: str, key: str) -> Aggregate:
        """How `kind`'s counter `key` adds up (an undeclared one: a sum, said once)."""
        if (kind, key) not in self._aggregates:
            found = next((c.aggregate for c in declared(kind) if c.matches(key)), None)
            if found is None:
                log.warning("%s sends the counter '%s', which the metrics table does not "
                            "declare: it adds up as a sum and makes no row", kind, key)
            self._aggregates[kind, key] = found or Aggregate.SUM
        return self._aggregates[kind, key]

    def observe(self, worker: str, kind: str, counters: dict[str, Any],
                arrays: dict[str, np.ndarray], first: bool = False,
                policy: str = DEFAULT_POLICY) -> None:
        """Take one heartbeat; `first` marks a new process's first report.

        A new learner brings the run counters it restored from a checkpoint;
        the jump is history, not this window's work, so rates skip it.
        """
        for key in counters.keys() - self.live.get(worker, {}).keys():
            self.aggregate(kind, key)  # a counter new to the table is named as it comes
        carried = [key for key in counters if self.aggregate(kind, key) is Aggregate.CARRIED] \
            if first else []
        before = {key: self.total(kind, key) for key in carried}
        self.kinds[worker] = kind
        self.policies[worker] = policy
        self._set_live(worker, {k: float(v) for k, v in counters.items()
                                if type(v) in NUMBERS and math.isfinite(v)})
        for key in carried:
            window_key = f"{kind}:{key}"
            self._previous[window_key] = self._previous.get(window_key, 0.0) + \
                self.total(kind, key) - before[key]
        self.episodes.observe(arrays)

    def offer(self, worker: str, kind: str, counters: dict[str, Any],
              arrays: dict[str, np.ndarray], first: bool = False,
              policy: str = DEFAULT_POLICY) -> None:
        """`observe`, later: a worker's latest heartbeat is kept until the next row (or the
        worker's retirement) takes it, with the episodes of every heartbeat before it. A
        row then costs one `observe` per worker, however many heartbeats came: a run of
        thousands of workers sends more than a row needs."""
        held = self._offered.get(worker)
        if held is None:
            self._offered[worker] = _Offered(kind, counters, [arrays] if arrays else [],
                                             first, policy)
            return
        held.counters, held.first = counters, held.first or first
        if arrays:
            held.arrays.append(arrays)

    def _take_offers(self, worker: str | None = None) -> None:
        """Observe what `offer` kept (of `worker`; of every worker without)."""
        taken = [worker] if worker is not None else list(self._offered)
        for name in taken:
            if (held := self._offered.pop(name, None)) is None:
                continue
            self.observe(name, held.kind, held.counters, held.arrays[0] if held.arrays else {},
                         held.first, held.policy)
            for arrays in held.arrays[1:]:
                self.episodes.observe(arrays)

    def retire(self, worker: str) -> None:
        """A worker died: keep its cumulative counters in the totals.

        Gauges and run counters stay as last seen until the successor's first
        heartbeat replaces them, so rows never drop to zero in between; levels go.
        """
        self._take_offers(worker)
        if worker not in self.live:
            return
        kind, held = self.kinds[worker], {}
        for key, value in self.live[worker].items():
            aggregate = self.aggregate(kind, key)
            if aggregate in HELD:
                held[key] = value
            elif aggregate is Aggregate.SUM:
                self.retired[f"{kind}:{key}"] += value
                self.retired[f"{kind}:{key}:{self.policies[worker]}"] += value
        self._set_live(worker, held)

    def _set_live(self, worker: str, counters: dict[str, float]) -> None:
        """`worker`'s live counters now, the running sums moved by what changed."""
        kind, policy = self.kinds[worker], self.policies[worker]
        by_kind, by_policy = self._sums[kind, None], self._sums[kind, policy]
        old = self.live.get(worker, {})
        for key, value in counters.items():
            if change := value - old.get(key, 0.0):
                by_kind[key] = by_kind.get(key, 0.0) + change
                by_policy[key] = by_policy.get(key, 0.0) + change
        for key in old.keys() - counters.keys():
            by_kind[key] = by_kind.get(key, 0.0) - old[key]
            by_policy[key] = by_policy.get(key, 0.0) - old[key]
        self.live[worker] = counters

    def total(self, kind: str, key: str, policy: str | None = None) -> float:
        """`key` summed over `kind`'s workers (of `policy`), those retired included."""
        live = self._sums[kind, policy].get(key, 0.0)
        retired = f"{kind}:{key}" if policy is None else f"{kind}:{key}:{policy}"
        return live + self.retired.get(retired, 0.0)

    def gauge(self, kind: str, key: str, policy: str | None = None) -> float | None:
        """The largest current value of `key` over `kind`'s workers (of `policy`)."""
        values = [c[key] for w, c in self.live.items() if self.kinds[w] == kind and key in c
                  and policy in (None, self.policies[w])]
        return max(values) if values else None

    def row(self, elapsed: float) -> dict[str, Any]:
        """One metrics row over the window since the previous row: every shown kind's
        declared rows, the episodes', and the counters every worker sends (the contract's
        keys first, for a reader of metrics.jsonl)."""
        self._take_offers()
        return self._row(elapsed)

    def _row(self, elapsed: float) -> dict[str, Any]:
        shown = [kind for kind in SHOWN_ALWAYS if kind in KINDS] + [
            kind for kind in dict.fromkeys(self.kinds.values()) if kind not in SHOWN_ALWAYS]
        totals = {f"{kind}:{name}": self.bases.get(f"{kind}:{name}", 0.0)
                  + self.total(kind, name) for kind in shown for name in self._windowed(kind)}
        delta = {k: v - self._previous.get(k, 0.0) for k, v in totals.items()}
        window = max(elapsed - self._previous_time, 1e-9)
        self._previous, self._previous_time = totals, elapsed
        row: dict[str, Any] = {"time": round(elapsed, 3)}
        for kind in shown:
            for counter in own_counters(kind):
                for declared_row in counter.rows:
                    self._add_row(row, kind, counter, declared_row, delta, window)
        self.episodes.add_rows(row, lambda key: self.gauge("evaluator", key))
        row["system/restarts"] = self.restarts
        row["system/learner_restarts"] = self.learner_restarts
        for counter in COMMON:
            for common_row in counter.rows:
                row[common_row.key] = int(sum(
                    self.total(kind, counter.name) for kind in set(self.kinds.values())))
        return {**{key: row[key] for key in CONTRACT_KEYS if key in row}, **row}

    def _windowed(self, kind: str) -> set[str]:
        """`kind`'s counters some row shows by their rise in the window (or divides by)."""
        names: set[str] = set()
        for counter in own_counters(kind):
            for row in counter.rows:
                if row.shown in WINDOWED:
                    names.update((counter.name, row.over) if row.over else (counter.name,))
        return names

    def _reported(self, kind: str, key: str) -> bool:
        """Whether a worker of `kind` has reported `key` (a live one, or a retired one's
        total)."""
        return any(key in c for w, c in self.live.items() if self.kinds[w] == kind) \
            or f"{kind}:{key}" in self.retired

    def _add_row(self, row: dict[str, Any], kind: str, counter: Counter, declared_row: Row,
                 delta: dict[str, float], window: float) -> None:
        """Add what `declared_row` makes of `kind`'s `counter` to `row`, if anything."""
        if declared_row.optional and not self._reported(kind, counter.name):
            return
        if counter.family:
            self._add_family(row, kind, counter, declared_row)
        elif POLICY in declared_row.key:
            policies = {self.policies[w] for w, k in self.kinds.items() if k == kind}
            if policies != {DEFAULT_POLICY}:
                for policy in sorted(policies):
                    value = self._value(kind, counter, declared_row, policy)
                    if value is not None:
                        row[declared_row.key.replace(POLICY, policy)] = value
        elif declared_row.shown in WINDOWED:
            value = self._windowed_value(kind, counter, declared_row, delta, window)
            if value is not None:
                row[declared_row.key] = value
        elif (value := self._value(kind, counter, declared_row)) is not None:
            row[declared_row.key] = value

    def _value(self, kind: str, counter: Counter, row: Row,
               policy: str | None = None) -> float | int | None:
        """A row's value of `counter` as it stands (None: the row is absent)."""
        name = counter.name
        if row.shown in (Shown.MEAN, Shown.LARGEST):
            values = [c[name] for w, c in self.live.items()
                      if self.kinds[w] == kind and name in c]
            if not values:
                return None
            return _rounded(float(np.mean(values)) if row.shown is Shown.MEAN else max(values),
                            row)
        if counter.aggregate is Aggregate.MAX:
            value = self.gauge(kind, name, policy)
            if value is None and policy is None and row.shown is Shown.TOTAL:
                value = 0.0
            if value is None or (row.shown is Shown.STEP and value < 0):
                return None
            return _rounded(value, row)
        base = self.bases.get(f"{kind}:{name}", 0.0) if policy is None else 0.0
        return _rounded(base + self.total(kind, name, policy), row)

    def _windowed_value(self, kind: str, counter: Counter, row: Row, delta: dict[str, float],
                        window: float) -> float | int | None:
        """A row's value of `counter`'s rise over the window (None: the row is absent)."""
        rise = delta[f"{kind}:{counter.name}"]
        if row.shown in (Shown.RATIO, Shown.SPARE):
            over = delta[f"{kind}:{row.over}"]
            if over <= 0:
                return None
            return _rounded(rise / over if row.shown is Shown.RATIO else 1 - rise / over, row)
        if row.shown is Shown.SHARE:
            window *= max(1, sum(1 for k in self.kinds.values() if k == kind))
        return _rounded(rise / window, row)

    def _add_family(self, row: dict[str, Any], kind: str, counter: Counter,
                    declared_row: Row) -> None:
        """Each live worker's counters of the family, under its policy's row keys."""
        for worker, counters in self.live.items():
            if self.kinds[worker] != kind:
                continue
            policy = self.policies[worker]
            prefix = declared_row.key if policy == DEFAULT_POLICY or \
                counter.aggregate is not Aggregate.PER_POLICY else f"{declared_row.key}{policy}/"
            for key, value in counters.items():
                if counter.matches(key):
                    row[f"{prefix}{key[len(counter.name):]}"] = _rounded(value, declared_row)


def tensorboard_tag(key: str) -> str | None:
    """The TensorBoard name of a metrics key: grouped keys keep their group, the
    contract keys go under `train/`; `time` is the event's wall time instead."""
    if key == "time":
        return None
    return key if "/" in key else f"train/{key}"


class MetricsWriter:
    """Appends rows to metrics.jsonl (flushed per row so a reader never waits) and
    to TensorBoard event files in the run directory, with env frames as the step."""

    def __init__(self, run_dir: Path, also: Callable[[str], None] | None = None) -> None:
        """`also`: takes each row's JSON line too (the population manager's rows stream:
        srl_jax/runtime/population_link.py)."""
        self._run_dir = run_dir
        self._file = open(Path(run_dir) / "metrics.jsonl", "a")  # noqa: SIM115 - held for the run
        self._events: Any = None
        self._also = also

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps(row)
        self._file.write(line + "\n")
        self._file.flush()
        if self._also is not None:
            self._also(line)
        if self._events is None:
            # Made at the first row: TensorBoard's import (0.15 s) held up the workers' start.
            from tensorboardX import SummaryWriter

            self._events = SummaryWriter(str(self._run_dir), flush_secs=5)
        for key, value in row.items():
            tag = tensorboard_tag(key)
            if tag is not None and isinstance(value, int | float):
                self._events.add_scalar(tag, value, global_step=row["env_frames"])

    def close(self) -> None:
        self._file.close()
        if self._events is not None:
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
