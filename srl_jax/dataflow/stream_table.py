"""The dataflow's streams, declared once: who binds, who connects, what travels, under which key.

Each `Stream` below is one row of the table; the docs render them all
(docs/reference/dataflow.md, generated), and `python -m srl_jax.launch EXP --plan` shows
which of them a config's run uses and what carries each (srl_jax/dataflow/plan.py).
Besides ZeroMQ streams there is one that is not a ZeroMQ socket: `coordinator`,
jax.distributed's gRPC between a policy's learner processes.

With host agents (srl_jax/runtime/hosts/host_agent.py) a host's workers reach the controller's
streams (stats, names, changes, logs) through their host's agent, which binds the same
streams for them and connects to the controller's as one peer for the whole host. It
also relays each policy's parameters to its host (srl_jax/runtime/hosts/param_relay.py): the
relays of a policy take the learner's stream in a tree over the relay stream, so that
the learner sends each version at most `runtime.param_fanout` times.

A worker that binds registers its endpoint in the name service under the
stream's key; one that connects looks the key up (`srl_jax.wire.names`). Every
bind, connect and lookup takes its key, socket type and expected message
kinds from an entry here, so both sides cannot drift apart.

Keys read `port.<stream>` or, for a stream with one binder per index (a
learner process, an inference server), `port.<stream>.<index>`. A stream of
each policy lives in that policy's namespace, `<policy>/port...`; the default
policy (the only one of a single-agent run) keeps the plain key. The `port.`
prefix keeps keys apart from metric names (`inference/batch_rows_mean`) and
from message kinds (`params`), so a grep for `port.` finds every key written
by hand. Keys show up as files under `<run_dir>/names/` and as `key` of each
worker's `ports` in `status.json`.

An algorithm that learns from replay (`srl_jax/dataflow/algorithms.py: Algorithm.source`)
turns the samples stream into two: actors push their chunks to the replay servers
(inserts), and the learner asks every server for sampled batches and sends back
new priorities (replay). A population run adds the control stream: its manager
tells a member's learner to copy another member (`srl_jax/config/population.py`); and two
of the controller's, so that the manager needs no file of the run directory
(srl_jax/runtime/population_link.py): rows, each metrics row as written, which the
manager ranks by; lineage, where a learner records each copy it made (the controller
appends it to `population.jsonl`) and the manager asks for the copies so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.wire.names import policy_key

KEY_PREFIX = "port."
BELL_SUFFIX = ".shm"


@dataclass(frozen=True)
class Stream:
    """One stream of the dataflow: a socket pair, its name-service key and its messages."""

    name: str
    binder: str
    """Worker kind (or `controller`) that binds the socket and registers the key."""
    connecters: tuple[str, ...]
    """Worker kinds that look the key up and connect."""
    bind_type: int | None
    """ZMQ socket type of the binding side; None: not a ZMQ socket (the coordinator)."""
    connect_type: int | None
    """ZMQ socket type of the connecting side; None: not a ZMQ socket."""
    binder_receives: frozenset[str]
    """Message kinds the binding side receives (what connecters send)."""
    connecter_receives: frozenset[str]
    """Message kinds the connecting side receives (what the binder sends)."""
    per_policy: bool
    """Each policy has its own (keys live in the policy's namespace)."""
    indexed: bool
    """Several binders, one key each (learner processes, inference servers)."""
    doc: str
    kernel_buffer: int | None = None
    """Bytes of kernel socket buffer at each end (SO_SNDBUF, SO_RCVBUF); None: the OS's
    own, which grows to megabytes. Small where the binder's reading pace must hold the
    connecters back: then only the high-water marks' messages are in flight."""
    connect_immediate: bool = False
    """The connecting side queues messages only on finished connections (ZMQ_IMMEDIATE):
    a request waits for no binder that is not up, and with none up a send raises
    `zmq.Again` instead of parking the message."""
    same_host: bool = False
    """Between workers of one host it can go through shared memory instead
    (srl_jax/wire/shm/, `transport.shared_memory`); its binders register a doorbell under
    `bell_key`."""

    @property
    def kinds(self) -> frozenset[str]:
        """Every message kind this stream carries, both ways."""
        return self.binder_receives | self.connecter_receives

    @property
    def is_zmq(self) -> bool:
        return self.bind_type is not None

    def key(self, policy: str = DEFAULT_POLICY, index: int | None = None) -> str:
        """The name-service key of `policy`'s binder number `index` of this stream."""
        if self.indexed != (index is not None):
            raise ValueError(f"stream '{self.name}' is {'' if self.indexed else 'not '}indexed; "
                             f"got index {index}")
        if not self.per_policy and policy != DEFAULT_POLICY:
            raise ValueError(f"stream '{self.name}' is one for all policies; got '{policy}'")
        key = KEY_PREFIX + self.name + ("" if index is None else f".{index}")
        return policy_key(policy, key)

    def bell_key(self, policy: str = DEFAULT_POLICY, index: int | None = None) -> str:
        """The key of binder `index`'s shared-memory doorbell (`same_host` streams)."""
        return self.key(policy, index) + BELL_SUFFIX


SAMPLES = Stream(
    name="samples", binder="learner", connecters=("actor",),
    bind_type=zmq.PULL, connect_type=zmq.PUSH,
    binder_receives=frozenset({"samples"}), connecter_receives=frozenset(),
    per_policy=True, indexed=True, same_host=True,
    doc="Chunks of trajectories; an actor spreads its chunks over every learner process.")
INFERENCE = Stream(
    name="inference", binder="inference", connecters=("actor",),
    bind_type=zmq.ROUTER, connect_type=zmq.DEALER,
    binder_receives=frozenset({"infer_request"}), connecter_receives=frozenset({"infer_reply"}),
    per_policy=True, indexed=True, same_host=True,
    doc="Observations to a policy's servers (spread over all of them), actions back to the "
        "asking actor.",
    connect_immediate=True)
INSERTS = Stream(
    name="inserts", binder="replay", connecters=("actor",),
    bind_type=zmq.PULL, connect_type=zmq.PUSH,
    binder_receives=frozenset({"samples"}), connecter_receives=frozenset(),
    per_policy=True, indexed=True, same_host=True,
    doc="Chunks of trajectories to a policy's replay servers (off-policy algorithms); an "
        "actor spreads its chunks over all of them. While a server's rate limiter holds "
        "inserts back, the actors' sends block (or drop) after a few chunks.",
    kernel_buffer=64 * 1024)
REPLAY = Stream(
    name="replay", binder="replay", connecters=("learner",),
    bind_type=zmq.ROUTER, connect_type=zmq.DEALER,
    binder_receives=frozenset({"sample_request", "priorities"}),
    connecter_receives=frozenset({"sampled"}),
    per_policy=True, indexed=True,
    doc="A learner process asks each replay server for sampled transitions and sends back "
        "their new priorities.")
PARAMS = Stream(
    name="params", binder="learner", connecters=("inference", "evaluator", "actor", "replay"),
    bind_type=zmq.PUB, connect_type=zmq.SUB,
    binder_receives=frozenset(), connecter_receives=frozenset({"params"}),
    per_policy=True, indexed=False,
    doc="Learner process 0 publishes each new version; subscribers keep the newest (actors "
        "only with inline inference, replay servers only where they reanalyse).")
RELAY = Stream(
    name="relay", binder="agent", connecters=("agent",),
    bind_type=zmq.XPUB, connect_type=zmq.SUB,
    binder_receives=frozenset(), connecter_receives=frozenset({"params", "relay_note"}),
    per_policy=True, indexed=True,
    doc="A host agent's relay of a policy's parameters, to the relays below it in the "
        "policy's tree (the agent's own host takes them on a local address), with a note "
        "now and then of the newest it holds; indexed by agent "
        "(srl_jax/runtime/hosts/param_relay.py).")
POOL = Stream(
    name="pool", binder="learner", connecters=("inference",),
    bind_type=zmq.PUB, connect_type=zmq.SUB,
    binder_receives=frozenset(), connecter_receives=frozenset({"snapshot"}),
    per_policy=True, indexed=False,
    doc="Self-play: the learner of a policy that frozen policies play publishes each new "
        "snapshot of its opponent pool, and each in turn again now and then; the frozen "
        "policies' servers hold the pool (srl_jax/config/opponent_pool.py).")
CONTROL = Stream(
    name="control", binder="learner", connecters=("population",),
    bind_type=zmq.ROUTER, connect_type=zmq.DEALER,
    binder_receives=frozenset({"exploit"}), connecter_receives=frozenset({"exploited"}),
    per_policy=True, indexed=False,
    doc="The population manager tells a member's learner to load another member's newest "
        "checkpoint and take new hyperparameters; the learner says what it loaded.")
STATS = Stream(
    name="stats", binder="controller",
    connecters=("actor", "inference", "learner", "evaluator", "replay", "population"),
    bind_type=zmq.PULL, connect_type=zmq.PUSH,
    binder_receives=frozenset({"stats", "stats_batch"}), connecter_receives=frozenset(),
    per_policy=False, indexed=False,
    doc="Heartbeats and counters of every worker to the controller; a host agent sends its "
        "host's heartbeats as batches.")
NAMES = Stream(
    name="names", binder="controller", connecters=STATS.connecters,
    bind_type=zmq.ROUTER, connect_type=zmq.DEALER,
    binder_receives=frozenset({"name_request"}), connecter_receives=frozenset({"name_reply"}),
    per_policy=False, indexed=False,
    doc="The name service over the network (`runtime.names`): workers register and look up "
        "the other streams' keys, and fetch the run's config (srl_jax/runtime/name_server.py).")
CHANGES = Stream(
    name="changes", binder="controller", connecters=STATS.connecters,
    bind_type=zmq.PUB, connect_type=zmq.SUB,
    binder_receives=frozenset(), connecter_receives=frozenset({"name_change"}),
    per_policy=False, indexed=False,
    doc="Each change of the name service's table, pushed to whoever follows keys, so that "
        "no worker asks again and again whether a peer moved (srl_jax/runtime/name_server.py).")
LOGS = Stream(
    name="logs", binder="controller", connecters=STATS.connecters,
    bind_type=zmq.PULL, connect_type=zmq.PUSH,
    binder_receives=frozenset({"log"}), connecter_receives=frozenset(),
    per_policy=False, indexed=False,
    doc="Each worker's output to `logs/<worker>.log` on the controller's host, with the "
        "network name service (srl_jax/runtime/log_stream.py).")
LINEAGE = Stream(
    name="lineage", binder="controller", connecters=("learner", "population"),
    bind_type=zmq.ROUTER, connect_type=zmq.DEALER,
    binder_receives=frozenset({"lineage_event", "lineage_request"}),
    connecter_receives=frozenset({"lineage"}),
    per_policy=False, indexed=False,
    doc="A population member's learner records each copy it made in `population.jsonl` on "
        "the controller's host; the population manager asks for the copies so far "
        "(srl_jax/runtime/population_link.py).")
ROWS = Stream(
    name="rows", binder="controller", connecters=("population",),
    bind_type=zmq.PUB, connect_type=zmq.SUB,
    binder_receives=frozenset(), connecter_receives=frozenset({"metrics_row"}),
    per_policy=False, indexed=False,
    doc="Each row of `metrics.jsonl` as the controller writes it, to the population "
        "manager, which ranks the members by it.")
COORDINATOR = Stream(
    name="coordinator", binder="learner", connecters=("learner",),
    bind_type=None, connect_type=None,
    binder_receives=frozenset(), connecter_receives=frozenset(),
    per_policy=True, indexed=False,
    doc="host:port of learner process 0's jax.distributed coordinator (gRPC, no CURVE), "
        "for a policy's other learner processes.")

STREAMS: tuple[Stream, ...] = (SAMPLES, INSERTS, REPLAY, INFERENCE, PARAMS, RELAY, POOL, CONTROL,
                               STATS, NAMES, CHANGES, LOGS, LINEAGE, ROWS, COORDINATOR)
"""Every name-service key of a run comes from one of these."""


def stream_of(key: str) -> Stream:
    """The stream a name-service key belongs to, whatever its policy and index (a
    binder's doorbell key, `Stream.bell_key`, belongs to its stream too)."""
    policy, _, bare = key.rpartition("/")
    bell = bare.endswith(BELL_SUFFIX)
    bare = bare.removesuffix(BELL_SUFFIX)
    for stream in STREAMS:
        if bell and not stream.same_host:
            continue
        base = KEY_PREFIX + stream.name
        if stream.indexed:
            index = bare.removeprefix(base + ".")
            matches = index != bare and index.isdigit()
        else:
            matches = bare == base
        if matches and (stream.per_policy or not policy):
            return stream
    raise KeyError(f"'{key}' is no stream's key")
