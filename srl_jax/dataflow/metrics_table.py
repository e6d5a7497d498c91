"""The metrics table: every counter a worker kind sends with its heartbeats, declared once.

A counter says its unit, how it adds up across workers and restarts (`Aggregate`), the
row keys of metrics.jsonl it becomes and how (`Shown`), and why it is there. The
controller's aggregator (srl_jax/runtime/metrics.py) derives its rows from this table,
the contract test reads it, and `metrics_markdown` renders it for the docs; a new worker
kind declares its counters here or beside its `register_kind` call
(srl_jax/dataflow/worker_kinds.py) and they reach metrics.jsonl. Also here: the names of the
heartbeat arrays (episode returns) and the pure helpers every kind shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np


class Labelled(Enum):
    """An enum whose members say what they mean (the docs' legend): (label, meaning)."""

    def __init__(self, label: str, meaning: str) -> None:
        self.label, self.meaning = label, meaning


class Aggregate(Labelled):
    """How a counter adds up across a kind's workers and their restarts."""

    SUM = ("sum", "cumulative, summed over the workers; a dead worker's last value stays "
                  "in the total")
    CARRIED = ("carried", "cumulative and the run's own: checkpointed, held while its worker "
                          "is down and restored by the successor (the jump is history, so "
                          "rates skip it)")
    LEVEL = ("level", "a current level, summed over the live workers; it dies with its worker")
    MAX = ("max", "a gauge: the largest over the workers, held as last seen while its worker "
                  "is down")
    PER_POLICY = ("per-policy", "a family of gauges (the name ends in '/'), one row key per "
                                "policy: `<row><x>` for the default policy, "
                                "`<row><policy>/<x>` for the others; held while its worker "
                                "is down")


class Shown(Labelled):
    """How a row shows a counter; the number of decimals is `Row.digits` or the default."""

    TOTAL = ("as aggregated", "the aggregate (a max counter's: 0 until one reports)")
    RATE = ("rate", "its rise in the window, per second")
    FRACTION = ("fraction", "its rise in the window (seconds), over the window")
    SHARE = ("share", "its rise in the window (seconds), over the window times the kind's "
                      "workers")
    RATIO = ("ratio", "its rise in the window over the rise of the counter it is divided by "
                      "(absent when that is 0)")
    SPARE = ("spare", "one minus the ratio: the part of the divisor's rise that is not "
                      "this counter's")
    MEAN = ("mean", "the mean of the live workers' values")
    LARGEST = ("largest", "the largest of the live workers' values")
    STEP = ("step", "a max counter that is negative until there is one (a checkpoint step): "
                    "absent so long")
    VALUE = ("value", "each worker's value as it is (a per-policy family's)")


DIGITS = {Shown.TOTAL: 0, Shown.RATE: 1, Shown.RATIO: 2, Shown.MEAN: 6, Shown.LARGEST: 6,
          Shown.STEP: 0, Shown.VALUE: 6}
"""Decimals a row rounds to where a `Row` does not say (0: an integer); the others 4."""
POLICY = "{policy}"
"""In a row key: one key per policy of the kind's workers, where they are not all the
default policy's (a population's members, a multi-agent run's policies)."""


@dataclass(frozen=True)
class Row:
    """A row key of metrics.jsonl made from one counter."""

    key: str
    shown: Shown = Shown.TOTAL
    over: str = ""
    """RATIO and SPARE: the counter whose rise divides this one's."""
    digits: int | None = None
    optional: bool = False
    """Absent until a worker of the kind reports the counter (not every platform or
    setup has it), instead of 0."""
    at_most: float | None = None
    """A bound the shown value is clipped to (a wait counted at a report's own pace can
    exceed the window it falls in)."""

    @property
    def decimals(self) -> int:
        return self.digits if self.digits is not None else DIGITS.get(self.shown, 4)


@dataclass(frozen=True)
class Counter:
    """A heartbeat counter of a worker kind (`name`: the key of its `counters()` dict)."""

    name: str
    unit: str
    aggregate: Aggregate
    doc: str
    rows: tuple[Row, ...] = ()

    @property
    def family(self) -> bool:
        """A family of counters `<name><x>` (the name ends in '/'), not one counter."""
        return self.name.endswith("/")

    def matches(self, key: str) -> bool:
        return key.startswith(self.name) if self.family else key == self.name


@dataclass(frozen=True)
class OtherRow:
    """A row key that no counter makes: the controller's own counts, episode arrays."""

    key: str
    unit: str
    source: str
    doc: str


SHOWN_ALWAYS = ("actor", "inference", "learner")
"""Kinds whose rows every row has (0 until a worker reports), in this order; another
kind's rows follow once one of its workers has reported."""
CONTRACT_KEYS = ("time", "env_frames", "fps", "learner_steps", "policy_version",
                 "episode_return_mean", "episode_length_mean", "policy_lag_mean",
                 "samples_dropped_stale")
"""The row keys users and tools rely on (the design's contract): these names never change."""

COMMON = (
    Counter("wire_rejected", "messages", Aggregate.SUM,
            "malformed or unexpected messages dropped (every kind and the controller)",
            (Row("system/wire_rejected"),)),
    Counter("auth_refused", "connections", Aggregate.SUM,
            "connections refused by CURVE authentication (every kind and the controller)",
            (Row("system/auth_refused"),)),
)
"""Counters every worker sends (srl_jax/runtime/worker_base.py): rows sum them over all kinds."""


_SUM, _CARRIED, _LEVEL, _MAX = Aggregate.SUM, Aggregate.CARRIED, Aggregate.LEVEL, Aggregate.MAX


def device_memory(kind: str) -> tuple[Counter, ...]:
    """A JAX kind's device memory counters: levels of the live process, summed over its
    devices, where the platform reports them (GPUs and TPUs do; the CPU does not)."""
    return (Counter("device_memory_mib", "MiB", Aggregate.LEVEL, "device memory in use",
                    (Row(f"{kind}/device_memory_mib", digits=1, optional=True),)),
            Counter("device_memory_peak_mib", "MiB", Aggregate.LEVEL, "peak device memory",
                    (Row(f"{kind}/device_memory_peak_mib", digits=1, optional=True),)))


def shm_binder(kind: str, received: tuple[Row, ...] = ()) -> tuple[Counter, ...]:
    """A binder's shared-memory counters (srl_jax/wire/shm/channels.py, `Inbox.counters`):
    0 where ZeroMQ carries its stream; `received`: the rows of the messages received."""
    return (Counter("shm_received", "messages", _SUM, "messages that came through shared "
                    "memory", received),
            Counter("shm_stale", "records", _SUM, "doorbell records dropped: their slot no "
                    "longer held the message (sent again, withdrawn, already taken: a record "
                    "replayed), its connecter gone, or a read that held a record cut short or "
                    "not ours (srl_jax/wire/shm/bell.py)", (Row(f"{kind}/shm_stale"),)),
            Counter("shm_mapped_mib", "MiB", _LEVEL, "connecters' slot files it maps (a dead "
                    "one's let go within a heartbeat timeout)",
                    (Row(f"{kind}/shm_mapped_mib", digits=2),)))


DEVICE_MEMORY = tuple(counter.name for counter in device_memory(""))
"""The device memory counters' names (status.json shows them per worker)."""
ACTOR = (
    Counter("env_frames", "frames", _SUM, "environment steps of all its envs",
            (Row("env_frames"), Row("fps", Shown.RATE), Row(f"policy/{POLICY}/env_frames"))),
    Counter("episodes", "episodes", _SUM, "episodes finished"),
    Counter("chunks_sent", "chunks", _SUM, "sample chunks sent"),
    Counter("chunks_dropped", "chunks", _SUM, "chunks dropped because the learner lagged",
            (Row("actor/chunks_dropped"),)),
    Counter("infer_timeouts", "requests", _SUM, "inference requests resent after a timeout",
            (Row("actor/infer_timeouts"),)),
    Counter("infer_resent", "requests", _SUM, "inference requests resent at once after "
            "a server was lost (srl_jax/dataflow/fan_in.py)", (Row("actor/infer_resent"),)),
    Counter("time_env", "s", _SUM, "time stepping environments",
            (Row("actor/time_env_frac", Shown.SHARE),)),
    Counter("time_wait", "s", _SUM, "time waiting for actions",
            (Row("actor/time_wait_frac", Shown.SHARE),)),
    Counter("time_send", "s", _SUM, "time sending chunks",
            (Row("actor/time_send_frac", Shown.SHARE),)),
    Counter("shm_mib", "MiB", _LEVEL, "shared memory of its slot files (requests, replies "
            "and chunks to workers of its host; 0 where ZeroMQ carries them)",
            (Row("actor/shm_mib", digits=2),)),
    Counter("shm_reclaimed", "slots", _SUM, "shared-memory slots taken back from a binder "
            "that died holding them (a chunk lost with its reader)",
            (Row("actor/shm_reclaimed"),)),
    Counter("shm_rerung", "records", _SUM, "doorbell records rung again for chunks left "
            "unread a heartbeat timeout (or rung on a FIFO since replaced)"),
    Counter("shm_handoffs", "streams", _SUM, "same-host streams handed to ZeroMQ: their "
            "binders could not be rung through shared memory for a heartbeat timeout",
            (Row("actor/shm_handoffs"),)),
)
INFERENCE = (
    Counter("requests", "requests", _SUM, "observation requests answered",
            (Row("inference/requests_per_batch", Shown.RATIO, over="batches"),)),
    Counter("rows", "rows", _SUM, "observation rows answered",
            (Row("inference/batch_rows_mean", Shown.RATIO, over="batches"),
             Row("inference/pad_frac", Shown.SPARE, over="padded_rows"))),
    Counter("batches", "batches", _SUM, "policy batches run"),
    Counter("padded_rows", "rows", _SUM, "rows run, padding to the fixed batch sizes included"),
    Counter("time_compute", "s", _SUM, "time running the policy",
            (Row("inference/time_compute_frac", Shown.SHARE),)),
    Counter("param_updates", "updates", _SUM, "parameter versions taken"),
    Counter("policy_version", "version", _MAX, "the parameter version it acts with"),
    Counter("simulations", "simulations", _SUM, "search simulations run: rows searched times "
            "`learner.muzero.simulations` (a policy that acts by search)",
            (Row("inference/simulations_per_s", Shown.RATE, optional=True),)),
    Counter("search_depth_sum", "nodes", _SUM, "depth of the deepest node of each row's "
            "search, summed (a policy that acts by search)",
            (Row("inference/search_depth_mean", Shown.RATIO, over="rows", optional=True),)),
    *shm_binder("inference", (Row("inference/shm_frac", Shown.RATIO, over="requests"),)),
    *device_memory("inference"),
)
LEARNER = (
    Counter("learner_steps", "updates", _MAX, "updates applied, which is the version of the "
            "newest parameters", (Row("learner_steps"), Row("policy_version"),
                                  Row(f"policy/{POLICY}/policy_version"))),
    Counter("frames_consumed", "frames", _CARRIED, "frames trained on",
            (Row("learner/samples_per_s", Shown.RATE),)),
    Counter("frames_received", "frames", _CARRIED, "frames received from actors"),
    Counter("episodes_received", "episodes", _CARRIED, "episodes whose returns arrived"),
    Counter("samples_dropped_stale", "frames", _CARRIED,
            "frames dropped as older than the staleness cap", (Row("samples_dropped_stale"),)),
    Counter("samples_dropped_full", "frames", _CARRIED, "frames dropped by a full queue",
            (Row("learner/samples_dropped_full"),)),
    Counter("lag_sum", "versions", _CARRIED,
            "learner version minus the acting version, summed over consumed frames",
            (Row("policy_lag_mean", Shown.RATIO, over="lag_count", digits=3),)),
    Counter("lag_count", "frames", _CARRIED, "frames counted in lag_sum"),
    Counter("queue_chunks", "chunks", _MAX, "chunks waiting in the sample queue",
            (Row("learner/queue_chunks"),)),
    Counter("checkpoints_saved", "checkpoints", _SUM, "checkpoints written"),
    Counter("checkpoint_step", "version", _MAX, "the newest checkpoint's step (-1: none yet)",
            (Row("learner/checkpoint_step", Shown.STEP),
             Row(f"policy/{POLICY}/checkpoint_step", Shown.STEP))),
    Counter("time_checkpoint", "s", _SUM, "time the updates waited for checkpoints",
            (Row("learner/time_checkpoint_frac", Shown.FRACTION),)),
    Counter("time_update", "s", _SUM, "time in update steps",
            (Row("learner/time_update_frac", Shown.FRACTION),)),
    Counter("time_put", "s", _SUM, "time putting batches on devices"),
    Counter("time_publish", "s", _SUM, "time publishing parameters"),
    Counter("train/", "", Aggregate.PER_POLICY,
            "the algorithm's training diagnostics of its last update (loss, entropy, ...; "
            "`train/hp/<name>`: live hyperparameters)", (Row("learner/", Shown.VALUE),)),
    Counter("replay_requests", "requests", _SUM, "sample requests sent to replay servers"),
    Counter("replay_timeouts", "requests", _SUM, "replay servers presumed gone (silent "
            "while asked)", (Row("learner/replay_timeouts", optional=True),)),
    Counter("replay_batches_ready", "batches", _LEVEL, "sampled batches waiting for an update"),
    Counter("replay_rounds_given_up", "batches", _SUM,
            "batches given up on: a server presumed gone, or a part malformed"),
    Counter("priorities_sent", "updates", _SUM, "priority updates sent to replay"),
    Counter("priorities_dropped", "updates", _SUM, "priority updates dropped"),
    *shm_binder("learner"),
    *device_memory("learner"),
)
REPLAY = (
    Counter("size", "transitions", _LEVEL, "items stored", (Row("replay/size"),)),
    Counter("inserted", "items", _SUM, "items inserted",
            (Row("replay/inserts_per_s", Shown.RATE),)),
    Counter("sampled", "items", _SUM, "items sampled",
            (Row("replay/samples_per_s", Shown.RATE),)),
    Counter("chunks", "chunks", _SUM, "chunks inserted"),
    Counter("priority_updates", "updates", _SUM, "priority updates applied"),
    Counter("priorities_stale", "updates", _SUM, "priority updates for items since replaced "
            "(or meant for a predecessor's memory)",
            (Row("replay/priorities_stale"),)),
    Counter("time_insert_wait", "s", _SUM, "time inserts waited on samples_per_insert",
            (Row("replay/insert_wait_frac", Shown.SHARE, at_most=1.0),)),
    Counter("time_sample_wait", "s", _SUM, "time sample requests waited for items",
            (Row("replay/sample_wait_frac", Shown.SHARE, at_most=1.0),)),
    Counter("time_insert", "s", _SUM, "time inserting"),
    Counter("time_sample", "s", _SUM, "time sampling"),
    Counter("pending_requests", "requests", _LEVEL, "sample requests waiting"),
    Counter("reanalysed", "items", _SUM, "steps of sampled windows whose search targets "
            "were renewed with the newest parameters (MuZero Reanalyze)",
            (Row("replay/reanalysed_per_s", Shown.RATE, optional=True),)),
    Counter("time_reanalyse", "s", _SUM, "time reanalysing",
            (Row("replay/reanalyse_frac", Shown.SHARE, optional=True),)),
    Counter("reanalyse_version", "version", _MAX, "the parameter version reanalysis "
            "searches with"),
    Counter("storage_mb", "MiB", _LEVEL, "memory of the stored items",
            (Row("replay/memory_mb", digits=1),)),
    Counter("rss_mb", "MiB", _LEVEL, "resident memory of the process",
            (Row("replay/rss_mb", digits=1),)),
    Counter("priority_min", "", _LEVEL, "the smallest priority stored"),
    Counter("priority_max", "", _LEVEL, "the largest priority stored",
            (Row("replay/priority_max", Shown.LARGEST, optional=True),)),
    Counter("priority_mean", "", _LEVEL, "the mean priority stored (rows: mean of the means)",
            (Row("replay/priority_mean", Shown.MEAN, optional=True),)),
    *shm_binder("replay"),
)
EVALUATOR = (
    Counter("evaluations", "evaluations", _SUM, "evaluations run"),
    Counter("eval_episodes", "episodes", _SUM, "evaluation episodes played"),
    Counter("eval_version", "version", _MAX, "the parameter version last evaluated"),
    Counter("eval_version/", "version", _MAX,
            "`eval_version/<member>`: a population member's version last evaluated"),
    *device_memory("evaluator"),
)
POPULATION = (
    Counter("exploits", "exploits", _MAX, "winners copied into losers so far (a restarted "
            "manager counts its lineage's)",
            (Row("population/exploits"),)),
    Counter("exploits_refused", "exploits", _SUM, "exploits a learner refused"),
    Counter("exploits_pending", "exploits", _LEVEL, "exploits waiting for the loser's learner"),
)
CARRIED = frozenset(c.name for c in LEARNER if c.aggregate is Aggregate.CARRIED)
"""The learner counters that belong to the run: checkpointed, and restored by a new learner."""

POLICY_RETURN = "policy_return/"
"""Heartbeat arrays `policy_return/<policy>`: single agents' episode returns, per policy."""
OPPONENT_VERSION = "opponent_version/"
"""Heartbeat arrays `opponent_version/<policy>` of a frozen policy that plays an opponent
pool (self-play): the snapshot version each episode played, one per episode begun."""
TEAM_RETURN = "team_return"
"""Heartbeat array of a multi-agent actor: each episode's team return (all agents'
rewards summed); its `episode_return` holds the same episodes' `agent_mean_returns`."""
EPISODE_WIN = "episode_win"
"""Heartbeat array of an actor whose env says who won (SMAX): 1.0 for each episode won,
0.0 for each one not, in the order the episodes ended."""
TEAM_EVAL_RETURN = "team_eval_return"
"""The evaluator's counterpart of TEAM_RETURN, beside its `eval_return`."""
MEMBER_EVAL = "eval_return/"
"""Heartbeat arrays `eval_return/<member>` (and gauges `eval_version/<member>`): a
population member's evaluation returns, evaluated apart from the other members."""
RETURN_WINDOWS = (20, 100)
"""Episode counts of the rolling return means in every row: 100 is Sample Factory's
`--stats_avg`, 20 the window bench/peers/compare.py reads the single-process baseline with."""

OTHER_ROWS = (
    OtherRow("time", "s", "controller", "seconds since the run started (resumes continue it)"),
    OtherRow("episode_return_mean", "return", "actor arrays", "mean return of the episodes "
             "finished in the window (multi-agent: each agent's own; absent when none)"),
    OtherRow("episode_length_mean", "steps", "actor arrays",
             "mean length of the episodes finished in the window"),
    OtherRow("episodes", "episodes", "actor arrays", "episodes finished in the window"),
    *(OtherRow(f"episode_return_mean_last{n}", "return", "actor arrays",
               f"mean return of the last {n} episodes, whichever rows they came in")
      for n in RETURN_WINDOWS),
    OtherRow("team_return_mean", "return", "actor arrays",
             "multi-agent: mean team return (all agents' rewards summed); also `_last<N>`"),
    OtherRow("win_rate", "fraction", "actor arrays", "envs that say who won (SMAX): the "
             "share of the episodes finished in the window that were won; also `_last<N>`"),
    OtherRow("eval_return_mean", "return", "evaluator arrays",
             "mean return of the evaluator's deterministic episodes in the window"),
    OtherRow("eval_policy_version", "version", "evaluator", "the version they evaluated"),
    OtherRow("team_eval_return_mean", "return", "evaluator arrays",
             "multi-agent: the evaluation's mean team return"),
    OtherRow(f"policy/{POLICY}/episode_return_mean", "return", "actor arrays",
             "mean return of one of the policy's agents"),
    OtherRow(f"policy/{POLICY}/eval_return_mean", "return", "evaluator arrays",
             "a member's or policy's evaluation return (and `.../eval_policy_version`)"),
    OtherRow(f"policy/{POLICY}/opponent_version_mean", "version", "actor arrays",
             "self-play: mean snapshot version a frozen policy played (and `_min`, `_max`)"),
    OtherRow("system/restarts", "restarts", "controller", "worker restarts so far"),
    OtherRow("system/learner_restarts", "restarts", "controller", "learner restarts so far"),
    OtherRow("system/resumes", "resumes", "controller", "times the run was resumed"),
    OtherRow("system/workers_missing", "workers", "controller",
             "workers waiting for a host with room"),
    OtherRow("system/heartbeats", "heartbeats", "controller",
             "whole heartbeats the controller has taken (counters and all)"),
    OtherRow("system/signs_of_life", "signs", "controller",
             "host agents' signs of life the controller has taken (heartbeats not sent whole)"),
)
"""Row keys no counter makes: the controller's own and those of the heartbeat arrays."""


def row_keys(counters: Sequence[Counter]) -> list[str]:
    """Every row key `counters` make (families and `{policy}` keys as templates)."""
    return [row.key for counter in counters for row in counter.rows]


def _row_cell(row: Row) -> str:
    return f"`{row.key}` ({row.shown.label}{', when reported' if row.optional else ''})"


def metrics_markdown(tables: Mapping[str, Sequence[Counter]]) -> str:
    """The metrics reference as markdown tables: what the aggregates and the ways a row
    shows a counter mean, each kind's counters (`tables`: by kind), the counters every kind
    sends, then the rows no counter makes."""
    lines = [f"In a row key, `{POLICY}` stands for each policy of the kind's workers, where "
             "they are not all the default policy's. The rows of "
             f"{', '.join(SHOWN_ALWAYS)} are in every row; another kind's appear once one of "
             "its workers has reported, and a row marked 'when reported' once a worker "
             "reports its counter.", "",
             "| aggregate | across workers and restarts |", "| --- | --- |",
             *(f"| {a.label} | {a.meaning} |" for a in Aggregate), "",
             "| shown | in a row |", "| --- | --- |",
             *(f"| {s.label} | {s.meaning} |" for s in Shown), ""]
    for kind, counters in [*tables.items(), ("every kind", COMMON)]:
        lines += [f"### {kind}", "", "| counter | unit | aggregate | row keys | what |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| `{c.name}` | {c.unit} | {c.aggregate.label} | "
                  f"{', '.join(_row_cell(r) for r in c.rows) or '-'} | "
                  f"{c.doc.replace('|', '/')} |" for c in counters]
        lines.append("")
    lines += ["### other rows", "", "| row key | unit | from | what |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.key}` | {r.unit} | {r.source} | {r.doc} |" for r in OTHER_ROWS]
    return "\n".join(lines) + "\n"


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
