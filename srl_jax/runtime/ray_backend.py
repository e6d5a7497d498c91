"""The Ray launch backend: Ray places each worker, ZMQ still carries the data.

For every worker the controller asks Ray for a `WorkerHost` actor with the
resources the config gives that kind (`ray.actor`, `ray.learner`, ...: CPUs,
GPUs, TPUs, a node type's custom resource). The host starts the worker on its
node as the local backend would (`python -m srl_jax.worker`, its own session,
output appended to `<run_dir>/logs/<worker>.log`) and reports its exit. A
worker that dies is started again by the controller's usual restart rule, on
a new host that Ray places, wherever the resources are.

Placement does not block: `start` asks Ray for the host and returns None until
Ray has placed it, so the run goes on while a worker waits for a node with
room (the standing request is also what an autoscaler scales up for). A host
whose node leaves the cluster ends with its worker (which stops when its
parent goes); `exit_code` marks that worker `lost`, and the controller places
it again without counting it against `runtime.max_restarts`.

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

import logging
import math
import os
import secrets
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict
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
    Process,
    WorkerHandle,
    spawn_worker,
    warm_address,
    worker_args,
)
from srl_jax.runtime.hosts.host_agent import HostAgent, agent_address
from srl_jax.runtime.hosts.warm_client import WarmChild, WarmParent
from srl_jax.runtime.name_server import NAMES_ENV, fixed_endpoint
from srl_jax.wire.names import FileNameService, NameService, worker_name
from srl_jax.wire.transport import BIND_HOST_ENV, KEYS_ENV, CurveKeys, Port

log = logging.getLogger(__name__)

AGENT_CHECK_S = 2.0
"""How often the driver asks each node's host agent which process it is (and logs a new one)."""
FORWARDED_ENV_PREFIX = "SRL_JAX_"
"""The driver's variables a worker on another node gets too (fault drills, hosts)."""
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
"""Where Ray takes its token from, before `~/.ray/auth_token`: the token itself, or its file."""
AUTOSCALER_METRICS_PORT = 44217
"""Where the autoscaler monitor of a local instance serves its Prometheus metrics (Ray's
AUTOSCALER_METRIC_PORT): plain HTTP on every interface, read-only, which `ray.init`
cannot turn off."""


class WorkerHost:
    """One worker process on the node Ray placed this actor on."""

    def __init__(self) -> None:
        self.process: Process | None = None
        self.warm: WarmParent | None = None

    def start(self, args: list[str], env: dict[str, str], log_path: str,
              bind_node: bool, agents: str | None, warm_run: str | None = None
              ) -> tuple[int, str, str, int | None]:
        """(pid, node address, node id, warm parent's pid) of the worker started; with
        `agents` (the run's token) it asks its node's host agent for names, not the
        controller; with `warm_run` (the run's token, for a kind forked warm) its node's
        warm parent for the run forks it (started by the first host of the node to ask)."""
        node = ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        env = {**os.environ, **env, **({BIND_HOST_ENV: node} if bind_node else {})}
        if agents:
            env[NAMES_ENV] = fixed_endpoint(agent_address(agents, node_id[:16]), NAMES)
        if warm_run is not None:
            self.warm = WarmParent(warm_address(f"{warm_run}-{node_id[:16]}"),
                                   Path(log_path).parent / f"warm_parent-{node_id[:16]}.log",
                                   os.environ)
        self.process = process = spawn_worker(args, env, Path(log_path), warm=self.warm)
        forked = self.warm is not None and isinstance(process, WarmChild)
        return process.pid, node, node_id, self.warm.pid if self.warm is not None and forked \
            else None

    @property
    def _started(self) -> Process:
        if self.process is None:
            raise RuntimeError("this host has started no worker")
        return self.process

    def wait(self) -> int:
        return self._started.wait()

    def signal(self, sig: int) -> None:
        if self._started.poll() is None:
            self._started.send_signal(sig)


class NodeAgent:
    """A node's host agent (srl_jax/runtime/hosts/host_agent.py), as a Ray actor that Ray starts
    again on the same node when it dies."""

    def __init__(self, upstream: str, keys: str, at: str, index: int, fanout: int,
                 bind_host: str | None) -> None:
        """`index`: the node's place in the parameter relays' trees (kept when Ray starts
        the agent again); `bind_host`: where its relays serve other nodes (None: the
        node's address)."""
        self.agent = HostAgent(zmq.Context(), upstream, CurveKeys.from_env(keys) if keys else None,
                               at, index, fanout, bind_host or ray.util.get_node_ip_address())

    def pid(self) -> int:
        return os.getpid()


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


def _placement(resources: dict[str, float]) -> dict[str, Any]:
    """Ray actor options for a resource request ({CPU: 1, GPU: 1, node_a: 1})."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0),
            **({"resources": custom} if custom else {})}


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
        self._host = ray.remote(max_concurrency=2, max_restarts=0)(WorkerHost)
        self._agent = ray.remote(num_cpus=0, max_restarts=-1)(NodeAgent)
        self._agents: dict[str, Any] = {}
        """The host agent of each node a worker was placed on, by node id."""
        self._agent_index: dict[str, int] = {}
        """Each agent's place in the parameter relays' trees: the lowest free one, so that
        a node that joins fills the place of one that left."""
        self._agent_pids: dict[str, Any] = {}
        """The ref of each node's agent's pid, asked every AGENT_CHECK_S."""
        self._known_pids: dict[str, int] = {}
        self._agents_checked = 0.0
        self._run_token = secrets.token_hex(4)
        self._warm_parents: dict[str, int] = {}
        """The pid of the warm parent that last forked a worker, by node address."""
        self._live: dict[int, Any] = {}
        self._pending: dict[str, tuple[Any, Any, dict[str, str] | None]] = {}
        """Each worker waiting to be placed: its host actor, the ref of its start and the
        environment it was given."""
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
        name = worker_name(kind, index, policy)
        if name not in self._pending:
            resources = worker_kind(kind).ray_resources(self.config)
            host = self._host.options(**_placement(resources)).remote()
            forwarded = {k: v for k, v in os.environ.items()
                         if k.startswith(FORWARDED_ENV_PREFIX)}
            agents = self._run_token if self._agents_wanted(env) else None
            self._pending[name] = host, host.start.remote(
                worker_args(kind, index, self.run_dir, policy), {**forwarded, **(env or {})},
                str(self.run_dir / "logs" / f"{name}.log"), self._bind_nodes, agents,
                self._run_token if self._warm(kind) else None), env
        host, started, env = self._pending[name]
        if not ray.wait([started], timeout=0)[0]:
            return None
        del self._pending[name]
        try:
            pid, node, node_id, warm_pid = ray.get(started)
        except ray.exceptions.RayError as error:  # its node left before the worker started
            log.warning("the host placed for %s died before starting it: %s", name,
                        str(error).splitlines()[0])
            ray.kill(host)
            return None
        if env is not None and self._agents_wanted(env):
            self._start_agent(node_id, env)
        if warm_pid is not None:
            self._warm_parents[node] = warm_pid
        handle = WorkerHandle(kind, index, pid, node, (host, host.wait.remote(), node_id),
                              policy)
        self._live[id(handle)] = host
        return handle

    def _warm(self, kind: str) -> bool:
        """Whether its node's warm parent forks a worker of `kind` (`runtime.warm_parent`)."""
        return self.config.runtime.warm_parent and worker_kind(kind).warm

    def _agents_wanted(self, env: dict[str, str] | None) -> bool:
        """Host agents serve workers that use the network name service (`runtime.host_agents`)."""
        return self.config.runtime.host_agents and NAMES_ENV in (env or {})

    def _start_agent(self, node_id: str, env: dict[str, str]) -> None:
        """The node's host agent, where it has none yet: its workers wait for it (their
        first name request is asked again until it answers)."""
        if node_id in self._agents:
            return
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        index = min(set(range(len(self._agents) + 1)) - set(self._agent_index.values()))
        agent = self._agent.options(scheduling_strategy=strategy).remote(
            env[NAMES_ENV], env.get(KEYS_ENV, ""), agent_address(self._run_token, node_id[:16]),
            index, self.config.runtime.param_fanout,
            None if self._bind_nodes else self.config.transport.bind_host)
        self._agents[node_id] = agent
        self._agent_index[node_id] = index

    def _check_agents(self) -> None:
        """Every AGENT_CHECK_S, ask each node's agent which process it is, and log it
        where that is new (a first start, or Ray's start of it again after it died)."""
        now = time.monotonic()
        if now - self._agents_checked < AGENT_CHECK_S:
            return
        self._agents_checked = now
        for node_id, agent in list(self._agents.items()):
            pid = self._agent_pids.get(node_id)
            if pid is None:
                self._agent_pids[node_id] = agent.pid.remote()
                continue
            if not ray.wait([pid], timeout=0)[0]:
                continue
            del self._agent_pids[node_id]
            try:
                pid = ray.get(pid)
            except ray.exceptions.RayError:  # it died while asked: Ray starts it again, or
                if not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
                    del self._agents[node_id]  # its node left (a worker placed there asks anew)
                    del self._agent_index[node_id]
                continue
            if self._known_pids.get(node_id) != pid:
                self._known_pids[node_id] = pid
                log.info("host agent of node %s: pid %d", node_id[:16], pid)

    def exit_code(self, handle: WorkerHandle) -> int | None:
        self._check_agents()
        host, exited, node_id = handle.ref
        if not ray.wait([exited], timeout=0)[0]:
            return None
        try:
            code = ray.get(exited)
        except ray.exceptions.RayError:  # the host itself died: its worker stops by itself
            code = -signal.SIGKILL
            if not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
                handle.lost = f"its Ray node ({handle.host}) left the cluster"
        if self._live.pop(id(handle), None) is not None:
            ray.kill(host)  # frees the resources for the successor
        return code

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        if id(handle) in self._live:
            handle.ref[0].signal.remote(sig)

    def close(self) -> None:
        for host in [*self._live.values(), *(host for host, _, _ in self._pending.values()),
                     *self._agents.values()]:
            ray.kill(host)
        self._live.clear()
        self._pending.clear()
        ray.shutdown()

