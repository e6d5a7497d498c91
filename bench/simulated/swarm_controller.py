"""The controller of `bench/swarm.py`: the real `Controller`, name service included, whose
launch backend starts simulated workers (bench/simulated/swarm_hosts.py) in place of processes.

`SwarmBackend` spreads the workers over the simulated hosts (worker i on host i mod H),
and the hosts over the host processes it starts (by pid, stopped by pid at the end). A
worker's pid is made up (unique per start): its heartbeats carry it, as a real worker's
carry its own, so the controller tells a successor from its predecessor as usual.
The run is configured as a cluster's is: CURVE on (keys made here, as `srl_jax.launch`
makes them, handed to the host processes in their environment), the product's
`runtime.heartbeat_timeout_s` and `runtime.stats_interval_s` unless `--set` says otherwise.
Start-up alone has STARTUP_TIMEOUT_S: a host process starts its simulated workers one
after another (a cluster's hosts start theirs at once); once the bench opens its window
(the window file), the supervisor's config is switched to the run's own timeout.
Run by bench/swarm.py: `python -m bench.simulated.swarm_controller --run-dir D --hosts H
--processes P [--churn F] [--set key=value ...]`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import yaml
import zmq

from bench.harness.machine import CONFIGS_DIR, DEFAULT_EXPERIMENT, REPO_ROOT
from bench.simulated.swarm_hosts import SOCKETS_PER_WORKER, WINDOW_FILE
from srl_jax.config.loader import config_to_dict, load_config
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig
from srl_jax.dataflow.worker_kinds import worker_plan
from srl_jax.runtime.backends import BackendError, LocalBackend, WorkerHandle
from srl_jax.runtime.controller import Controller
from srl_jax.runtime.name_server import NAMES_ENV
from srl_jax.runtime.supervisor import Supervisor
from srl_jax.wire.names import worker_name
from srl_jax.wire.transport import KEYS_ENV, CurveKeys

EVENTS_S = 0.02
"""How often the backend takes the exits the host processes report."""
FIRST_PID = 1 << 22
STARTUP_TIMEOUT_S = 600.0
"""`runtime.heartbeat_timeout_s` until the window opens (start-up)."""
"""Made-up pids start above any real one (Linux's pid_max is at most 2^22)."""


class SwarmBackend(LocalBackend):
    """A launch backend whose workers are simulated, on H hosts in P processes (the local
    backend's names and run directory)."""

    def __init__(self, run_dir: Path, config: ExperimentConfig, hosts: int,
                 processes: int, simulate: str, churn: float, keys: CurveKeys | None) -> None:
        super().__init__(run_dir)
        self.simulate, self.churn, self.keys = simulate, churn, keys
        self.config = config
        self.hosts, self.processes = hosts, processes
        self.context = zmq.Context.instance()
        self.commands = [self.context.socket(zmq.PUSH) for _ in range(processes)]
        """One per host process: a PUSH queues what is sent before its process connects."""
        for socket in self.commands:
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.LINGER, 0)
        self.commands_endpoints = [
            f"tcp://127.0.0.1:{socket.bind_to_random_port('tcp://127.0.0.1')}"
            for socket in self.commands]
        self.events = self.context.socket(zmq.PULL)
        port = self.events.bind_to_random_port("tcp://127.0.0.1")
        self.events_endpoint = f"tcp://127.0.0.1:{port}"
        self.exits: dict[int, int] = {}
        self._events_at = 0.0
        self.pids = itertools.count(FIRST_PID)
        self.host_of = {name: i % hosts for i, name in enumerate(
            worker_name(kind, index, policy) for kind, index, policy in worker_plan(config))}
        self.children: list[subprocess.Popen] = []
        """The host processes, the p-th simulating hosts p, p + P, p + 2P, ..."""
        self.host_died = False
        self.supervisor: Supervisor | None = None
        """The controller's, whose config gets the run's own heartbeat timeout once the
        window opens."""

    def _start_hosts(self, names_endpoint: str) -> None:
        """The host processes, once the controller's name service is up."""
        per_process = [list(range(p, self.hosts, self.processes)) for p in range(self.processes)]
        workers = len(self.host_of)
        run = secrets.token_hex(4)
        for p, hosts in enumerate(per_process):
            if not hosts:
                continue
            sockets = SOCKETS_PER_WORKER * workers * len(hosts) // self.hosts + 64
            self.children.append(subprocess.Popen(
                [sys.executable, "-m", "bench.simulated.swarm_hosts", "--names", names_endpoint,
                 "--commands", self.commands_endpoints[p], "--events", self.events_endpoint,
                 "--hosts", ",".join(map(str, hosts)), "--run", run,
                 "--servers", str(self.config.inference.count),
                 "--learners", str(self.config.learner.processes),
                 "--sockets", str(sockets), "--out", str(self.run_dir / f"hosts-{p}.json"),
                 "--window", str(self.run_dir / WINDOW_FILE), "--churn", str(self.churn),
                 "--simulate", self.simulate, *(["--first"] if p == 0 else [])],
                cwd=REPO_ROOT, stdout=open(self.run_dir / "logs" / f"hosts-{p}.log", "ab"),  # noqa: SIM115
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, KEYS_ENV: self.keys.to_env() if self.keys else ""}))

    def start(self, kind: str, index: int, policy: str = DEFAULT_POLICY,
              env: dict[str, str] | None = None) -> WorkerHandle:
        if not self.children:
            self._start_hosts((env or {})[NAMES_ENV])
        name = worker_name(kind, index, policy)
        pid = next(self.pids)
        host = self.host_of[name]
        self.commands[host % self.processes].send(msgpack.packb({
            "op": "start", "worker": name, "kind": kind, "index": index, "policy": policy,
            "pid": pid, "host": host}))
        return WorkerHandle(kind, index, pid, f"h{host}", host, policy)

    def placement_wait(self, kind: str) -> str:
        return "nothing: a simulated worker starts at once"

    def exit_code(self, handle: WorkerHandle) -> int | None:
        now = time.monotonic()
        if now < self._events_at:  # the supervisor asks for every worker in turn
            return self.exits.get(handle.pid)
        self._events_at = now + EVENTS_S
        if self.supervisor is not None and self.supervisor.config is not self.config \
                and (self.run_dir / WINDOW_FILE).exists():
            self.supervisor.config = self.config
        while self.events.poll(0):
            event = msgpack.unpackb(self.events.recv())
            self.exits[event["pid"]] = event["code"]
        child = self.children[handle.ref % self.processes]
        if child.poll() is not None:  # its simulated workers went with it: the run has no figure
            if not self.host_died:
                self.host_died = True
                raise BackendError(f"host process {child.pid} exited with {child.returncode};"
                                   f" see {self.run_dir / 'logs'}")
            return self.exits.setdefault(handle.pid, -signal.SIGKILL)
        return self.exits.get(handle.pid)

    def send_signal(self, handle: WorkerHandle, sig: int) -> None:
        with contextlib.suppress(zmq.Again):  # its host process is gone, and its workers
            self.commands[handle.ref % self.processes].send(msgpack.packb({
                "op": "signal", "pid": handle.pid, "signal": int(sig)}), zmq.NOBLOCK)

    def close(self) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for socket in self.commands:
            socket.close()
        self.events.close(linger=0)


def swarm_config(workers: int, hosts: int, overrides: list[str]) -> ExperimentConfig:
    """The default experiment with `workers` workers: one learner, a server per 100 workers
    (at least one), actors for the rest; no evaluator, no checkpoints, stopped by bench/swarm.py."""
    servers = max(1, workers // 100)
    actors = workers - 1 - servers
    if actors < 1:
        raise SystemExit(f"bench.swarm: --workers must be at least 3 (got {workers})")
    return load_config(CONFIGS_DIR / f"{DEFAULT_EXPERIMENT}.yaml", [
        f"actors.count={actors}", f"inference.count={servers}", "evaluation.every_updates=0",
        "checkpoint.enabled=false", "stop.target_return=null", "stop.wall_time_s=86400",
        "stop.env_frames=0", "runtime.names=network",
        "transport.curve=true", *overrides])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--simulate", choices=("workers", "agents"), default="workers")
    parser.add_argument("--churn", type=float, default=0.0)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    config = swarm_config(args.workers, args.hosts, args.overrides)
    (args.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (args.run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config),
                                                             sort_keys=False))
    logging.basicConfig(level=logging.WARNING, filename=args.run_dir / "logs" / "controller.log",
                        format="%(asctime)s controller %(levelname)s %(name)s: %(message)s")
    keys = CurveKeys.generate() if config.transport.curve else None  # as srl_jax.launch
    backend = SwarmBackend(args.run_dir, config, args.hosts, args.processes, args.simulate,
                           args.churn, keys)
    os.environ.pop(NAMES_ENV, None)
    timeout = max(STARTUP_TIMEOUT_S, config.runtime.heartbeat_timeout_s)
    startup = replace(config, runtime=replace(config.runtime, heartbeat_timeout_s=timeout))
    controller = Controller(startup, args.run_dir, backend, keys=keys, network_names=True)
    backend.supervisor = controller.supervisor
    return controller.run()


if __name__ == "__main__":
    sys.exit(main())
