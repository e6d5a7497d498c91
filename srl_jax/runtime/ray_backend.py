"""The Ray launch backend: Ray places one agent per node, ZMQ still carries the data.

The controller places each worker itself: on the first node whose resources, as Ray
lists them (`ray.nodes()`: CPUs, GPUs, TPUs, a node type's custom resource), less what
this run's workers hold there, have room for those the config gives its kind
(`ray.actor`, `ray.learner`, ...). That node's `NodeAgent`, a Ray actor pinned to it
(started with the node's first worker, and by Ray again there when it dies), starts the
worker as the local backend would (`python -m srl_jax.worker`, its own session, output
appended to `<run_dir>/logs/<worker>.log`, or a fork of the node's warm parent), keeps
it, and reports its exit: the controller asks each agent every POLL_S for the exits
since it last asked, so Ray's actors and calls grow with the nodes, not the workers. A
worker that asks for GPUs gets device ids of its node's (`CUDA_VISIBLE_DEVICES`). A
worker that dies is started again by the controller's usual restart rule, wherever a
node has room.

Placement does not block: `start` returns None while no node has room (the worker
waits, and is placed as soon as a node with room joins) or its agent has not answered.
A node that leaves Ray's list takes its workers (which stop when their agent goes); an
agent that Ray started again answers as a new one, and the workers of the one before
stopped with it. Either way `exit_code` marks those workers `lost`, and the controller
places them again without counting it against `runtime.max_restarts`.

Workers bind their node's address (unless `transport.bind_host` says
otherwise), so CURVE is on by default. Nodes need not share a filesystem: on a
cluster given by address the controller serves names, the run's config and a
log stream over the network (`runtime.names`, srl_jax/runtime/name_server.py), and a
learner checkpoints to `checkpoint.dir` (its own disk or a bucket); a worker's
`--run-dir` on another node is only its scratch. Without `--ray-address` a
local Ray instance is started with enough logical CPUs for every worker (they
share the cores, as with the local backend) and shut down at the end; with
one, the run joins that cluster and leaves it running. Ray's servers listen on
every interface (Ray binds no loopback-only node), so a local instance runs
with Ray's token authentication
(Ray's default where `RAY_AUTH_MODE` is unset; its token in `~/.ray/auth_token`, which
the run makes readable by its user alone);
one with it turned off is refused unless `transport.allow_unauthenticated` says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import secrets
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray
import zmq
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from srl_jax.config.checks import RAY_AUTH_MODE
from srl_jax.config.operations import TransportConfig
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig
from srl_jax.dataflow.stream_table import NAMES
from srl_jax.dataflow.worker_kinds import worker_kind, worker_plan
from srl_jax.runtime.backends import (
    BackendError,
    WorkerHandle,
    warm_address,
    worker_args,
)
from srl_jax.runtime.hosts.host_agent import HostAgent, agent_address
from srl_jax.runtime.hosts.node_workers import NodeWorkers
from srl_jax.runtime.hosts.warm_client import WarmChild, WarmParent
from srl_jax.runtime.name_server import NAMES_ENV, fixed_endpoint
from srl_jax.wire.names import FileNameService, NameService, worker_name
from srl_jax.wire.transport import BIND_HOST_ENV, KEYS_ENV, CurveKeys, Port

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the driver asks each node's agent for its workers' exits (one call per node):
as often as the supervisor looks at each worker (`WATCH_ROUND_S`)."""
NODES_CHECK_S = 1.0
"""How often the driver asks Ray which nodes are alive (a node gone takes its workers)."""
PLACE_CHECK_S = 0.25
"""How often, at most, a worker waiting for room has Ray's list of nodes asked again."""
LOST = -signal.SIGKILL
"""The exit code of a worker that went with its node or its node's agent."""
CUDA_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
"""The GPUs a worker that asks for some sees: those its node's share gave it (as Ray
set it for an actor with `num_gpus`); one that asks none sees what its agent sees."""
FORWARDED_ENV_PREFIX = "SRL_JAX_"
"""The driver's variables a worker on another node gets too (fault drills, hosts)."""
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
"""Where Ray takes its token from, before `~/.ray/auth_token`: the token itself, or its file."""
AUTOSCALER_METRICS_PORT = 44217
"""Where the autoscaler monitor of a local instance serves its Prometheus metrics (Ray's
AUTOSCALER_METRIC_PORT): plain HTTP on every interface, read-only, which `ray.init`
cannot turn off."""


class NodeAgent:
    """One per node the run uses, as a Ray actor pinned to the node that Ray starts again
    there when it dies: it starts the node's workers as plain processes and keeps them
    (srl_jax/runtime/hosts/node_workers.py), reports their exits when the controller asks,
    and, for workers on the network name service with `runtime.host_agents`, is the node's
    host agent (srl_jax/runtime/hosts/host_agent.py)."""

    def __init__(self, run: str, index: int, fanout: int, bind_host: str | None,
                 upstream: str | None, keys: str) -> None:
        """`run`: the run's token (its host agent's and warm parent's addresses); `index`:
        the node's place in the parameter relays' trees (kept when Ray starts the agent
        again); `bind_host`: where its relays serve other nodes (None: the node's address);
        `upstream`: the controller's name service, for a host agent (None: none)."""
        self.born = time.time_ns()
        """Which start of the agent this is: a later one is born later."""
        self.node = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.run = run
        self.workers = NodeWorkers()
        self.warm: WarmParent | None = None
        self.agent = None if upstream is None else HostAgent(
            zmq.Context(), upstream, CurveKeys.from_env(keys) if keys else None,
            agent_address(run, self.node_id[:16]), index, fanout, bind_host or self.node)

    def start(self, serial: int, args: list[str], env: dict[str, str], log_path: str,
              bind_node: bool, warm: bool) -> tuple[int, int, int | None]:
        """(this agent's birth, the worker's pid, the warm parent's pid where it forked it):
        the worker asks this agent for names where it is a host agent, and, for a kind
        forked warm (`warm`), is forked by the node's warm parent for the run (started by
        the first such start)."""
        env = {**os.environ, **env, **({BIND_HOST_ENV: self.node} if bind_node else {})}
        if self.agent is not None and NAMES_ENV in env:
            env[NAMES_ENV] = fixed_endpoint(agent_address(self.run, self.node_id[:16]), NAMES)
        if warm and self.warm is None:
            self.warm = WarmParent(warm_address(f"{self.run}-{self.node_id[:16]}"),
                                   Path(log_path).parent / f"warm_parent-{self.node_id[:16]}.log",
                                   os.environ)
        process = self.workers.start(serial, args, env, Path(log_path),
                                     self.warm if warm else None)
        forked = isinstance(process, WarmChild)
        return self.born, process.pid, self.warm.pid if forked and self.warm else None

    def exits(self) -> tuple[int, int, dict[int, int]]:
        """(this agent's birth, its pid, the codes of its workers that ended since the last
        call, by serial)."""
        return self.born, os.getpid(), self.workers.exits()

    def signal(self, serial: int, sig: int) -> None:
        self.workers.signal(serial, sig)


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail in seconds with one line where nothing listens at `address` (host:port);
    ray.init would wait minutes."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as error:
        raise BackendError(f"no Ray cluster at '{address}': {error}") from None


def token_auth() -> bool:
    """Whether this driver's Ray uses token authentication: Ray 2.60 turns it on for a
    new local instance where RAY_AUTH_MODE is unset (and says so in the variable); a
    cluster joined by address uses it where the variable says 'token'."""
    return os.environ.get(RAY_AUTH_MODE, "").lower() == "token"


def private_token(local: bool, environ: Mapping[str, str] | None = None) -> Path | None:
    """Ray's token file, readable by this user alone: made here, 0600, for a new local
    instance that would have Ray make it (Ray writes it with the umask's mode, 0644 under
    the usual 022: any user of the host could read the key to the run's Ray), and an
    existing one narrowed to 0600. None where the token is not in a file (`RAY_AUTH_TOKEN`)
    or a local instance runs without token authentication."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV) or (local and env.get(RAY_AUTH_MODE, "token").lower() != "token"):
        return None
    path = Path(env.get(TOKEN_PATH_ENV) or Path.home() / ".ray" / "auth_token")
    if local and not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))  # 256 bits in hex, as Ray makes them
        log.info("Ray's token: made %s (0600)", path)
    elif path.exists() and path.stat().st_mode & 0o077:
        path.chmod(0o600)
        log.warning("Ray's token %s was readable by other users; now 0600", path)
    return path


def listening(host: str, port: int) -> bool:
    """Whether something accepts connections at host:port now."""
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def fits(free: Mapping[str, float], wanted: Mapping[str, float]) -> bool:
    """Whether a node with `free` resources has room for `wanted` ({CPU: 1, actor_node: 1})."""
    return all(free.get(key, 0.0) >= amount - 1e-9 for key, amount in wanted.items()
               if amount > 0)


def take_gpus(free: list[float], wanted: float) -> list[int] | None:
    """The device ids of a node's GPUs (`free`: each one's unused share, taken from here)
    for a worker that asks `wanted` of them, or None where they are not free: whole GPUs
    for 1 or more, else a share of one (the most used one it fits on, as Ray packs them)."""
    if wanted <= 0:
        return []
    if wanted >= 1:
        whole = [device for device, share in enumerate(free) if share >= 1.0 - 1e-9]
        if len(whole) < math.ceil(wanted):
            return None
        taken = whole[:math.ceil(wanted)]
        for device in taken:
            free[device] = 0.0
        return taken
    room = [device for device, share in enumerate(free) if share >= wanted - 1e-9]
    if not room:
        return None
    device = min(room, key=lambda d: free[d])
    free[device] -= wanted
    return [device]


def give_gpus(free: list[float], taken: list[int], wanted: float) -> None:
    """Return to `free` the GPUs that `take_gpus` gave a worker that asked `wanted`."""
    for device in taken:
        free[device] = min(1.0, free[device] + min(wanted, 1.0))


@dataclass
class RayWorker:
    """The Ray backend's hold on a worker (`WorkerHandle.ref`): where its agent runs it, under
    which serial, what it holds there, and its exit code once its agent reported it."""

    node_id: str
    serial: int
    resources: dict[str, float]
    gpus: list[int]
    born: int = 0
    """The birth of the agent that started it (`NodeAgent.born`)."""
    code: int | None = None


@dataclass
class Node:
    """A node the run started workers on, with its agent."""

    agent: Any
    index: int
    address: str
    used: dict[str, float] = dataclasses.field(default_factory=dict)
    """What this run's workers hold there."""
    gpus: list[float] = dataclasses.field(default_factory=list)
    """The unused share of each of its GPUs, by device id."""
    born: int = 0
    """The birth of its agent as last heard: replies from an older one are stale."""
    asked: Any = None
    """The ref of the agent's exits asked for and not yet taken."""
    live: dict[int, WorkerHandle] = dataclasses.field(default_factory=dict)
    """Its workers not yet seen ended, by serial."""


class RayBackend:
    def __init__(self, run_dir: Path, config: ExperimentConfig,
                 address: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.config = config
        self._names = FileNameService(self.run_dir / "names")
        address = address or config.ray.address
        private_token(local=not address)
        if address:
            check_reachable(address)
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            wanted = sum(worker_kind(kind).ray_resources(config).get("CPU", 0.0)
                         for kind, _, _ in worker_plan(config))
            ray.init(address="local",  # a new instance, never one already on this machine
                     num_cpus=max(os.cpu_count() or 1, math.ceil(wanted)),
                     include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        if not address and not token_auth() and not config.transport.allow_unauthenticated:
            ray.shutdown()
            raise BackendError("the local Ray instance started without token authentication "
                               "(set RAY_AUTH_MODE=token, or transport.allow_unauthenticated)")
        self.node = ray.util.get_node_ip_address()
        self._bind_nodes = config.transport.bind_host == TransportConfig.bind_host
        self._agent = ray.remote(num_cpus=0, max_restarts=-1)(NodeAgent)
        self._nodes: dict[str, Node] = {}
        """Each node a worker was started on, by node id, with its agent."""
        self._cluster: dict[str, dict[str, Any]] = {}
        """The cluster's live nodes as Ray last listed them (`ray.nodes()`), by node id."""
        self._listed = self._polled = -math.inf
        self._serials = itertools.count()
        self._run_token = secrets.token_hex(4)
        self._warm_parents: dict[str, int] = {}
        """The pid of the warm parent that last forked a worker, by node address."""
        self._pending: dict[str, tuple[WorkerHandle, Any]] = {}
        """Each worker whose start its agent has not answered yet: its handle to be, and the
        ref of the start."""
        self._ports = self._ray_ports(local=not address)
        log.info("Ray %s: %s", "cluster" if address else "local instance", ray.cluster_resources())

    def name_service(self) -> NameService:
        return self._names

    def bind_host(self) -> str | None:
        return self.node if self._bind_nodes else None

    def _ray_ports(self, local: bool) -> list[dict[str, Any]]:
        """Ray's own ports that this run opened (a local instance: its GCS, raylet, object
        manager, runtime-env agent and autoscaler metrics) or joins (a cluster: its GCS),
        token-authenticated where Ray's token authentication is on. Each Ray worker
        process also serves gRPC, on a port of its own, under the same token."""
        token = token_auth()
        gcs = ray.get_runtime_context().gcs_address
        ports = [Port("ray.gcs", gcs, f"*:{gcs.rpartition(':')[2]}", token)]
        if not local:
            return [asdict(ports[0])]
        node = next(n for n in ray.nodes() if n["NodeID"] == ray.get_runtime_context()
                    .get_node_id())
        for key, field in (("ray.raylet", "NodeManagerPort"),
                           ("ray.object_manager", "ObjectManagerPort"),
                           ("ray.runtime_env_agent", "RuntimeEnvAgentPort")):
            if node.get(field, -1) > 0:
                bind = self.node if field == "RuntimeEnvAgentPort" else "*"
                ports.append(Port(key, f"{self.node}:{node[field]}",
                                  f"{bind}:{node[field]}", token))
        if listening(self.node, AUTOSCALER_METRICS_PORT):
            ports.append(Port("ray.autoscaler_metrics", f"{self.node}:{AUTOSCALER_METRICS_PORT}",
                              f"0.0.0.0:{AUTOSCALER_METRICS_PORT}", False))
        return [asdict(port) for port in ports]

    def ports(self) -> list[dict[str, Any]]:
        return self._ports

    def shared_memory_dir(self) -> str | None:
        return None

    def warm_parents(self) -> list[dict[str, Any]]:
        """Each node's, as of its last fork (its log: `logs/warm_parent-<node id>.log`)."""
        return [{"host": node, "pid": pid} for node, pid in self._warm_parents.items()]

    def placement_wait(self, kind: str) -> str:
        return f"no node has {worker_kind(kind).ray_resources(self.config)} free (ray.{kind})"

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY,
              env: dict[str, str] | None = None) -> WorkerHandle | None:
        """None while no node has room for the worker (this run's workers counted against
        each node's resources), or its node's agent has not answered the start yet."""
        name = worker_name(kind, index, policy)
        if name not in self._pending:
            handle = self._place(kind, index, policy, env or {})
            if handle is None:
                return None
        handle, started = self._pending[name]
        if handle.ref.node_id not in self._nodes:  # its node left before its agent answered
            del self._pending[name]
            return None
        if not ray.wait([started], timeout=0)[0]:
            return None
        del self._pending[name]
        worker = handle.ref
        try:
            worker.born, handle.pid, warm_pid = ray.get(started)
        except ray.exceptions.RayError as error:  # its agent died, or its node left
            log.warning("the agent of node %s did not start %s: %s", worker.node_id[:16], name,
                        str(error).splitlines()[0])
            self._release(worker)
            return None
        if warm_pid is not None:
            self._warm_parents[handle.host] = warm_pid
        self._nodes[worker.node_id].live[worker.serial] = handle
        return handle

    def _place(self, kind: str, index: int, policy: str, env: dict[str, str]
               ) -> WorkerHandle | None:
        """Ask the agent of the first node with room for the worker to start it (the
        node's agent started first where it has none): its handle, pid to come, or None
        where no node has room."""
        resources = worker_kind(kind).ray_resources(self.config)
        fitting = self._fitting(resources)
        if fitting is None:
            return None
        node_id, shares, gpus = fitting
        node = self._node(node_id, env)
        node.gpus = shares
        for key, amount in resources.items():
            node.used[key] = node.used.get(key, 0.0) + amount
        worker = RayWorker(node_id, next(self._serials), resources, gpus)
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}
        name = worker_name(kind, index, policy)
        devices = {CUDA_DEVICES_ENV: ",".join(map(str, gpus))} if gpus else {}
        started = node.agent.start.remote(
            worker.serial, worker_args(kind, index, self.run_dir, policy),
            {**forwarded, **env, **devices}, str(self.run_dir / "logs" / f"{name}.log"),
            self._bind_nodes, self._warm(kind))
        handle = WorkerHandle(kind, index, 0, node.address, worker, policy)
        self._pending[name] = handle, started
        return handle

    def _fitting(self, resources: dict[str, float]
                 ) -> tuple[str, list[float], list[int]] | None:
        """The first live node whose resources, less what this run's workers hold there,
        make room for `resources`: its id, its GPUs' unused shares once the worker has its
        own, and the device ids the worker gets."""
        self._list_nodes(force=True)
        for node_id, listed in self._cluster.items():
            node = self._nodes.get(node_id)
            used = node.used if node is not None else {}
            free = {key: amount - used.get(key, 0.0)
                    for key, amount in listed["Resources"].items()}
            shares = list(node.gpus) if node is not None else \
                [1.0] * int(listed["Resources"].get("GPU", 0))
            if fits(free, resources) and (
                    gpus := take_gpus(shares, resources.get("GPU", 0.0))) is not None:
                return node_id, shares, gpus
        return None

    def _list_nodes(self, force: bool = False) -> None:
        """Ray's list of live nodes, asked again at most every NODES_CHECK_S (`force`:
        every PLACE_CHECK_S, for a worker waiting for room)."""
        now = time.monotonic()
        if now - self._listed < (PLACE_CHECK_S if force else NODES_CHECK_S):
            return
        self._listed = now
        self._cluster = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}

    def _node(self, node_id: str, env: dict[str, str]) -> Node:
        """The node's state, its agent started where it has none yet (a host agent too
        where its workers use one: they wait for it, asking again until it answers)."""
        if node_id in self._nodes:
            return self._nodes[node_id]
        index = min(set(range(len(self._nodes) + 1)) - {n.index for n in self._nodes.values()})
        agent = self._agent.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            self._run_token, index, self.config.runtime.param_fanout,
            None if self._bind_nodes else self.config.transport.bind_host,
            env[NAMES_ENV] if self._agents_wanted(env) else None, env.get(KEYS_ENV, ""))
        node = self._nodes[node_id] = Node(agent, index,
                                           self._cluster[node_id]["NodeManagerAddress"])
        return node

    def _release(self, worker: RayWorker) -> None:
        """What a worker held on its node, free again (for its successor)."""
        node = self._nodes.get(worker.node_id)
        if node is None:
            return
        for key, amount in worker.resources.items():
            node.used[key] = node.used.get(key, 0.0) - amount
        give_gpus(node.gpus, worker.gpus, worker.resources.get("GPU", 0.0))

    def _warm(self, kind: str) -> bool:
        """Whether its node's warm parent forks a worker of `kind` (`runtime.warm_parent`)."""
        return self.config.runtime.warm_parent and worker_kind(kind).warm

    def _agents_wanted(self, env: dict[str, str]) -> bool:
        """Host agents serve workers that use the network name service (`runtime.host_agents`)."""
        return self.config.runtime.host_agents and NAMES_ENV in env

    def _poll(self) -> None:
        """At most every POLL_S: take each node's exits where its agent has answered, and
        ask each for the next (one Ray call per node, whatever its workers). A node gone
        from Ray's list takes its workers with it, each lost."""
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return
        self._polled = now
        self._list_nodes()
        asked = [node.asked for node in self._nodes.values() if node.asked is not None]
        ready = set(ray.wait(asked, num_returns=len(asked), timeout=0)[0]) if asked else set()
        for node_id, node in list(self._nodes.items()):
            if node_id not in self._cluster:
                self._node_left(node_id, node)
                continue
            if node.asked in ready:
                with contextlib.suppress(ray.exceptions.RayError):  # it died while asked:
                    self._heard(node_id, node, *ray.get(node.asked))  # Ray starts it again
                node.asked = None
            if node.asked is None:
                node.asked = node.agent.exits.remote()

    def _heard(self, node_id: str, node: Node, born: int, pid: int,
               codes: dict[int, int]) -> None:
        """A node's agent's answer: its workers' exits, and, from an agent started since
        them, that they stopped with the one that started them (each lost, not a fault of
        its own)."""
        if born < node.born:  # an answer of the agent before, taken after the new one's
            return
        if born > node.born:
            node.born = born
            log.info("agent of node %s: pid %d", node_id[:16], pid)
            for handle in [h for h in node.live.values() if h.ref.born < born]:
                handle.lost = "its node's agent died, and its workers with it"
                self._ended(node, handle, LOST)
        for serial, code in codes.items():
            if (ended := node.live.get(serial)) is not None:
                self._ended(node, ended, code)

    def _ended(self, node: Node, handle: WorkerHandle, code: int) -> None:
        handle.ref.code = code
        del node.live[handle.ref.serial]
        self._release(handle.ref)

    def _node_left(self, node_id: str, node: Node) -> None:
        """A node Ray no longer lists: its workers went with it, its agent too."""
        log.warning("Ray node %s (%s) left the cluster", node_id[:16], node.address)
        for handle in list(node.live.values()):
            handle.lost = f"its Ray node ({handle.host}) left the cluster"
            self._ended(node, handle, LOST)
        del self._nodes[node_id]

    def exit_code(self, handle: WorkerHandle) -> int | None:
        """As its node's agent last reported it (asked every POLL_S)."""
        self._poll()
        return handle.ref.code

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        node = self._nodes.get(handle.ref.node_id)
        if handle.ref.code is None and node is not None:
            node.agent.signal.remote(handle.ref.serial, sig)

    def close(self) -> None:
        """Every worker has been waited for: the agents go (a worker still starting stops
        with its agent)."""
        for node in self._nodes.values():
            ray.kill(node.agent)
        self._nodes.clear()
        self._pending.clear()
        ray.shutdown()
