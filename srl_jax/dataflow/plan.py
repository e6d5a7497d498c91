"""The run a config makes, wired in one place: which workers it starts, which streams join
them, and what carries each stream (`python -m srl_jax.launch EXP --plan` prints it; the
docs draw it from here).

The worker kinds (worker_kinds.py) say how many of each a config asks for; the stream
table (stream_table.py) says who may bind and connect each stream. Which of those
connections a config makes is decided here, by one rule per connection (`CONNECTIONS`),
from the same facts the workers act on: the algorithm's source (`chunk_stream`), inline
inference, reanalysis, self-play pools, populations, the name service. What carries a
stream is the launcher's choice for the run (`Carriers`): shared memory between workers
of one host where the launcher owns it, ZeroMQ over TCP otherwise, with CURVE off
loopback. From the links follow the sockets each process holds (`Plan.sockets`: an actor
joins `inference.servers_per_actor` servers, srl_jax/dataflow/fan_in.py), which the
launcher checks against the open-file limit before it starts anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig, acting_policies, run_policies
from srl_jax.dataflow.algorithms import chunk_stream, reanalyses
from srl_jax.dataflow.fan_in import servers_per_actor
from srl_jax.dataflow.stream_table import (
    CHANGES,
    CONTROL,
    INFERENCE,
    INSERTS,
    LINEAGE,
    LOGS,
    NAMES,
    PARAMS,
    POOL,
    REPLAY,
    ROWS,
    SAMPLES,
    STATS,
    Stream,
)
from srl_jax.dataflow.worker_kinds import KINDS, worker_plan

CONTROLLER = "controller"
OTHER_FILES = 256
"""Descriptors a process holds besides its sockets, at most (Python's and JAX's files,
ZeroMQ's context, its log, shared memory)."""


@dataclass(frozen=True)
class Carriers:
    """What the launcher chose to carry this run's streams."""

    backend: str = "local"
    shared_memory: bool = False
    """The launcher owns shared memory for its workers (`transport.shared_memory`)."""
    network_names: bool = False
    """Names, heartbeats' peers and logs go through the controller's sockets, not files."""
    curve: bool = False
    """Sockets bind off loopback, with CURVE."""


@dataclass(frozen=True)
class Workers:
    kind: str
    policy: str
    count: int
    entry: str
    """The class that runs them for this config ("module:Class")."""


@dataclass(frozen=True)
class Link:
    """One stream of one policy as the run uses it: its binder, the kinds that connect to
    it, and what carries it."""

    stream: Stream
    policy: str
    connecters: tuple[str, ...]
    transport: str


Rule = Callable[[ExperimentConfig, str], bool]
"""(config, policy) -> whether the connection is made for that policy's stream."""


def _sends_chunks(stream: Stream) -> Rule:
    return lambda config, policy: chunk_stream(config) is stream and policy in run_policies(
        config)


def _trained(config: ExperimentConfig, policy: str) -> bool:
    return policy in run_policies(config)


def _started(kind: str) -> Rule:
    """The run has workers of `kind`, as the worker kinds count them."""
    return lambda config, policy: KINDS[kind].count(config) > 0


def _served(config: ExperimentConfig, policy: str) -> bool:
    return _started("inference")(config, policy) and policy in acting_policies(config)


def _pooled(config: ExperimentConfig, policy: str) -> bool:
    return policy in config.selfplay.opponents.values() and _served(config, policy)


_exploits = _started("population")


def _member(config: ExperimentConfig, policy: str) -> bool:
    return bool(config.population.members)


def _every(config: ExperimentConfig, policy: str) -> bool:
    return True


CONNECTIONS: dict[tuple[str, str], Rule] = {
    (SAMPLES.name, "actor"): _sends_chunks(SAMPLES),
    (INSERTS.name, "actor"): _sends_chunks(INSERTS),
    (REPLAY.name, "learner"): _sends_chunks(INSERTS),
    (INFERENCE.name, "actor"): _served,
    (PARAMS.name, "inference"): lambda config, policy: _trained(config, policy) and _served(
        config, policy),
    (PARAMS.name, "evaluator"): lambda config, policy: _trained(config, policy) and
    _started("evaluator")(config, policy),
    (PARAMS.name, "actor"): lambda config, policy: _trained(config, policy) and
    config.actors.inline_inference,
    (PARAMS.name, "replay"): lambda config, policy: _sends_chunks(INSERTS)(config, policy)
    and reanalyses(config),
    (POOL.name, "inference"): _pooled,
    (CONTROL.name, "population"): lambda config, policy: _exploits(config, policy) and
    _trained(config, policy),
    (STATS.name, "*"): _every,
    (NAMES.name, "*"): _every,
    (CHANGES.name, "*"): _every,
    (LOGS.name, "*"): _every,
    (LINEAGE.name, "learner"): _member,
    (LINEAGE.name, "population"): _exploits,
    (ROWS.name, "population"): _exploits,
}
"""Every connection a run may make, (stream, connecting kind; '*' every kind) -> when it
does. The host agents' relay stream and jax.distributed's coordinator are the cluster's
(srl_jax/runtime/hosts/), not the config's."""

NETWORK_ONLY = frozenset({NAMES.name, CHANGES.name, LOGS.name})
"""Streams that exist only with the network name service; otherwise files in the run
directory serve."""


def connects(config: ExperimentConfig, stream: Stream, kind: str,
             policy: str = DEFAULT_POLICY) -> bool:
    """Whether workers of `kind` connect to `policy`'s `stream` in this run."""
    rule = CONNECTIONS.get((stream.name, kind)) or CONNECTIONS.get((stream.name, "*"))
    return rule is not None and kind in stream.connecters and rule(config, policy)


@dataclass(frozen=True)
class Plan:
    config: ExperimentConfig
    carriers: Carriers
    workers: tuple[Workers, ...]
    links: tuple[Link, ...]

    def lines(self) -> list[str]:
        """The plan as `--plan` prints it."""
        where = "this host" if self.carriers.backend == "local" else "a Ray cluster"
        out = [f"srl_jax: plan of {self.config.name} ({self.carriers.backend} backend, {where})",
               "workers:"]
        named = len({w.policy for w in self.workers}) > 1
        for w in self.workers:
            policy = f"  policy {w.policy}" if named else ""
            out.append(f"  {w.kind:<11}x{w.count:<4} {w.entry}{policy}")
        out.append("streams:")
        for link in self.links:
            policy = f" [{link.policy}]" if named and link.stream.per_policy else ""
            arrow = "<->" if link.stream.connecter_receives and link.stream.binder_receives \
                else "->" if link.stream.binder_receives else "<-"
            ends = f"{', '.join(link.connecters)} {arrow} {link.stream.binder}"
            out.append(f"  {link.stream.name + policy:<22} {ends:<40} {link.transport}")
        if not self.carriers.network_names:
            out.append("  (names: files under the run directory's names/; logs: its logs/)")
        held = ", ".join(f"{kind} {count}" for kind, count in self.sockets().items())
        out.append(f"sockets per process, at most: {held}")
        return out

    def _joins(self, link: Link, kind: str) -> int:
        """How many binders of `link` one connecter of `kind` connects to: an actor
        `inference.servers_per_actor` of its servers, others every binder."""
        binders = self._binders(link)
        if link.stream is INFERENCE and kind == "actor":
            return servers_per_actor(self.config.inference.servers_per_actor, binders)
        return binders if link.stream.indexed else 1

    def sockets(self) -> dict[str, int]:
        """The most sockets (connections and listening ports) one process of each kind,
        and the controller, holds in this run: a binder its connecters' share, as if one
        of its peers were lost and their connecters had moved to the rest; the controller
        one more per worker (its process handle or log file)."""
        counts = {(w.kind, w.policy): w.count for w in self.workers}
        held: dict[tuple[str, str], int] = {}

        def add(kind: str, policy: str, sockets: int) -> None:
            own = policy if (kind, policy) in counts else DEFAULT_POLICY
            held[kind, own] = held.get((kind, own), 0) + sockets

        for link in self.links:
            binders, share = self._binders(link), 1  # its listening port
            for kind in link.connecters:
                connecters = counts.get((kind, link.policy)) or \
                    counts.get((kind, DEFAULT_POLICY), 0)
                joins = self._joins(link, kind)
                add(kind, link.policy, joins)
                left = binders - 1 if joins < binders else binders
                share += min(connecters, math.ceil(connecters * joins / max(left, 1)))
            add(link.stream.binder, link.policy, share)
        add(CONTROLLER, DEFAULT_POLICY, sum(counts.values()))
        most: dict[str, int] = {}
        for (kind, _), sockets in held.items():
            most[kind] = max(most.get(kind, 0), sockets)
        return most

    def _binders(self, link: Link) -> int:
        if link.stream.binder == CONTROLLER:
            return 1
        return next(w.count for w in self.workers
                    if w.kind == link.stream.binder and w.policy == link.policy)

    def open_files_problem(self, limit: int) -> str | None:
        """Why processes of this run could not open their files under `limit` (a host's
        hard limit, which each raises its own to), or None where they can."""
        need = {kind: sockets + OTHER_FILES for kind, sockets in self.sockets().items()}
        kind, most = max(need.items(), key=lambda item: item[1])
        if most <= limit:
            return None
        return (f"a process of kind '{kind}' needs up to {most} open files ({most - OTHER_FILES} "
                f"sockets), over this host's limit of {limit} (`ulimit -Hn`): raise it, or "
                "lower 'inference.servers_per_actor' or the worker counts")

    def mermaid(self) -> str:
        """The plan as a mermaid flowchart: worker kinds as nodes, streams as edges."""
        nodes = {CONTROLLER: CONTROLLER}
        nodes.update({w.kind: f"{w.kind} x{w.count}" for w in self.workers})
        out = ["flowchart LR", *(f"  {kind}[\"{label}\"]" for kind, label in nodes.items())]
        for link in self.links:
            if link.stream.name in (STATS.name, *NETWORK_ONLY):
                continue
            for kind in link.connecters:
                source, target = (kind, link.stream.binder) if link.stream.binder_receives \
                    else (link.stream.binder, kind)
                out.append(f"  {source} -- \"{link.stream.name}: {link.transport}\" --> {target}")
        return "\n".join(out)


def _transport(stream: Stream, carriers: Carriers) -> str:
    if stream.same_host and carriers.shared_memory:
        return "shared memory"
    return "ZeroMQ TCP, CURVE" if carriers.curve else "ZeroMQ TCP, loopback" \
        if carriers.backend == "local" else "ZeroMQ TCP"


def make_plan(config: ExperimentConfig, carriers: Carriers = Carriers()) -> Plan:
    """The workers of `config`'s run and the streams between them, as `carriers` carry them."""
    counts: dict[tuple[str, str], int] = {}
    for kind, _, policy in worker_plan(config):
        counts[kind, policy] = counts.get((kind, policy), 0) + 1
    workers = tuple(Workers(kind, policy, count, KINDS[kind].entry_for(config))
                    for (kind, policy), count in counts.items())
    present = {w.kind for w in workers}
    links = []
    for stream in (SAMPLES, INSERTS, REPLAY, INFERENCE, PARAMS, POOL, CONTROL, LINEAGE, ROWS,
                   STATS, NAMES, CHANGES, LOGS):
        if (stream.binder != CONTROLLER and stream.binder not in present) or (
                stream.name in NETWORK_ONLY and not carriers.network_names):
            continue
        policies = acting_policies(config) if stream.per_policy else [DEFAULT_POLICY]
        for policy in policies:
            kinds = tuple(kind for kind in stream.connecters
                          if kind in present and connects(config, stream, kind, policy))
            if kinds and (stream.binder == CONTROLLER or (stream.binder, policy) in counts):
                links.append(Link(stream, policy, kinds, _transport(stream, carriers)))
    return Plan(config, carriers, workers, tuple(links))

