"""The child process of the overhead measurements: the server and learner ends (a real
`InferenceServer` acting with zeros, a bare pyzmq echo, a bare shared-memory echo, the
learner's intake without an update), and the handle the measuring process starts and
stops it by."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from actors.envs import policy_spec
from bench.harness.launcher import BenchError
from bench.overhead.cases import START_TIMEOUT_S, micro_config
from bench.overhead.shared_slots import (
    SlotSegment,
    doorbell_path,
    make_fifos,
    open_held,
    reply_path,
    segment_path,
)
from srl_jax.dataflow.stream_table import INFERENCE, PARAMS, SAMPLES
from srl_jax.wire.shm.place import OWNER_ENV
from srl_jax.wire.streams import make_socket


def _zero_act(params: Any, obs: np.ndarray, state: np.ndarray, mask: np.ndarray, key: Any,
              counter: Any) -> np.ndarray:
    """Stands in for the jitted network, no JAX call: `pack_outputs`' layout for a
    discrete action (log-probability, value, action: zeros), then the state as it came."""
    return np.concatenate([np.zeros((obs.shape[0], 3), np.float32), state], axis=1)


def zero_runner(config: Any, spec: Any, sampling_seed: int, min_size: int,
                max_size: int, published: bool) -> Any:
    """A policy runner that acts with `_zero_act`, its (empty) parameters already
    taken, so that the server does not wait for a learner's (`published` or not)."""
    from policy.policy_runner import PolicyRunner, padded_sizes

    runner = PolicyRunner(_zero_act, {}, spec, padded_sizes(min_size, max_size), sampling_seed)
    runner.set_params({}, version=0)
    return runner


def _until_end(conn: Connection, step: Callable[[], None],
               counters: Callable[[], dict[str, float]]) -> None:
    """`step` until the parent says 'end'; each command ('mark', 'end') is answered
    with this process's CPU times and the measured side's counters."""
    while True:
        step()
        if conn.poll():
            command = conn.recv()
            conn.send({"cpu_s": time.process_time(), "thread_cpu_s": time.thread_time(),
                       **counters()})
            if command == "end":
                return


def own_shared_memory(case: dict[str, Any]) -> None:
    """Workers made here use shared memory where the case asks, in the directory of the
    measuring process (which removes it)."""
    if case.get("shared_memory") == "on":
        os.environ[OWNER_ENV] = str(case["owner"])
    else:
        os.environ.pop(OWNER_ENV, None)


def _server(case: dict[str, Any], root: Path) -> tuple[Any, zmq.Socket]:
    """A real inference server acting with zeros, set up, and the learner's parameter
    socket it follows (which sends nothing)."""
    from policy.inference_server import InferenceServer
    from srl_jax.wire.names import FileNameService
    from srl_jax.wire.transport import Transport

    own_shared_memory(case)
    names = FileNameService(root / "names")
    context = zmq.Context.instance()
    learner_params = make_socket(context, PARAMS.bind_type)
    Transport(context).bind(learner_params, names, PARAMS.key())
    server = InferenceServer(micro_config(case), 0, root, names, runner_factory=zero_runner)
    try:
        server.setup()
    except BaseException:
        learner_params.close()
        raise
    return server, learner_params


def _serve_requests(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """A real inference server acting with zeros, until the parent says 'end'; it tells
    the parent its socket's endpoint, or its doorbell's with shared memory."""
    server, learner_params = _server(case, root)
    try:
        key = INFERENCE.bell_key if server.inference.inbox is not None else INFERENCE.key
        conn.send(server.names.get(key(server.policy, server.index)))
        _until_end(conn, server.run_once, server.counters)
    finally:
        server.close()
        learner_params.close()


def _serve_an_actor(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """What an actor needs of a run: a server acting with zeros and a learner's intake,
    stepped in turn until the parent says 'end'; the parent's actor finds both under
    `root`'s names."""
    server, learner_params = _server(case, root)
    try:
        learner = LearnerEnd(case, root)
    except BaseException:
        server.close()
        learner_params.close()
        raise

    def step() -> None:
        server.run_once()
        learner.step(0)

    try:
        conn.send(str(root / "names"))
        _until_end(conn, step, lambda: {**server.counters(), **learner.counters()})
    finally:
        learner.close()
        server.close()
        learner_params.close()


def _echo_requests(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """The floor under the server: plain pyzmq, no runtime code. A ROUTER socket
    answers each request with the same reply (encoded once: one row per request row)
    as soon as it arrives, until the parent says 'end'. Over loopback TCP, or over
    `ipc://` (a Unix socket under `root`) with `case["ipc"]`: what co-located actors
    and servers would gain from it."""
    from policy.inference_server import POLL_MS
    from srl_jax.wire.codec import encode

    rows = case["envs"]
    reply = encode("infer_reply", {"split": 0, "seq": 0, "version": 0, "batch_rows": rows},
                   {"action": np.zeros(rows, np.int32), "logp": np.zeros(rows, np.float32),
                    "value": np.zeros(rows, np.float32)})
    reply = [bytes(frame) for frame in reply]
    router = make_socket(zmq.Context.instance(), zmq.ROUTER)
    if case.get("ipc"):
        root.mkdir(parents=True, exist_ok=True)
        endpoint = f"ipc://{root / 'echo.sock'}"
        router.bind(endpoint)
    else:
        endpoint = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    answered = 0

    def step() -> None:
        nonlocal answered
        if router.poll(POLL_MS):
            while True:
                try:
                    request = router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                router.send_multipart([request[0], *reply])
                answered += 1

    conn.send(endpoint)
    try:
        _until_end(conn, step, lambda: {"requests": answered, "batches": answered})
    finally:
        router.close()


def _echo_shared_memory(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """The floor of a same-host transport through shared memory
    (bench/overhead/shared_slots.py): the waiting slots' rows gathered into one batch,
    a fixed reply written into each slot, a byte into each asker's FIFO; no ZMQ and no
    runtime code, until the parent says 'end'. The segment is removed however it ends."""
    import select

    from policy.inference_server import POLL_MS

    make_fifos(root, case["in_flight"])
    with contextlib.ExitStack() as opened:
        segment = SlotSegment.map(segment_path(case), case, create=True)
        opened.callback(segment.path.unlink)

        def held(path: Path) -> int:
            opened.callback(os.close, fd := open_held(path))
            return fd

        doorbell = held(doorbell_path(root))
        replies = [held(reply_path(root, i)) for i in range(case["in_flight"])]
        reply = np.zeros(segment.replies.shape[1:], np.float32)
        poller = select.poll()
        poller.register(doorbell, select.POLLIN)
        answered = batches = 0

        def step() -> None:
            nonlocal answered, batches
            if not poller.poll(POLL_MS):
                return
            slots = list(os.read(doorbell, 4096))
            batch = segment.requests[slots]  # the gather a server's batch makes
            segment.replies[slots] = reply
            for slot in slots:
                os.write(replies[slot], b"\x01")
            answered, batches = answered + len(batch), batches + 1

        conn.send({"segment": str(segment.path), "fifos": str(root)})
        _until_end(conn, step, lambda: {"requests": answered, "batches": batches})


class LearnerEnd:
    """The learner's intake without an update, built by the learner's own `open_intake`
    (a socket, and shared memory where the case asks); `step` follows
    `LearnerWorker.run_once` up to the update."""

    def __init__(self, case: dict[str, Any], root: Path) -> None:
        from learners.intake.intake import open_intake
        from learners.training.mesh import make_learner_mesh
        from srl_jax.runtime.worker_base import Worker
        from srl_jax.wire.names import FileNameService

        class IntakeShell(Worker):
            kind = "learner"

        own_shared_memory(case)
        config = micro_config(case)
        self.shell = IntakeShell(config, 0, root, FileNameService(root / "names"))
        self.mesh = make_learner_mesh(config.learner.devices, config.learner.batch_envs)
        self.intake = open_intake(self.shell, policy_spec(config), config.learner.batch_envs, 0)
        self.on_device = None

    def _prefetch(self) -> Any:
        """The next batch on its way to the device (None while too few chunks wait)."""
        from learners.algorithms.train_state import to_batch
        from learners.training.mesh import put_batch

        batch = self.intake.take_batch(0)
        return None if batch is None else put_batch(to_batch(batch), self.mesh)

    def step(self, timeout_ms: int) -> None:
        import jax

        self.intake.pump(0 if self.on_device is not None else timeout_ms, 0)
        if self.on_device is None:
            self.on_device = self._prefetch()
        if self.on_device is not None:
            jax.block_until_ready(self.on_device)  # where the update would run
            self.on_device = self._prefetch()  # overlaps the transfer with the next receive

    def counters(self) -> dict[str, float]:
        return {"frames_received": self.intake.frames_received,
                "frames_consumed": self.intake.frames_consumed,
                "rejected": self.shell.rejects.count}

    def close(self) -> None:
        self.intake.close()


def _take_samples(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """The learner's intake without an update, until the parent says 'end'."""
    from learners.learner_worker import POLL_MS

    learner = LearnerEnd(case, root)
    try:
        conn.send(learner.shell.names.get(SAMPLES.key(index=0)))
        _until_end(conn, lambda: learner.step(POLL_MS), learner.counters)
    finally:
        learner.close()


CHILD_ROLES = {"requests": _serve_requests, "echo": _echo_requests,
               "echo-ipc": _echo_requests, "shm-echo": _echo_shared_memory,
               "samples": _take_samples, "actor": _serve_an_actor}


def sink_main(conn: Connection) -> None:
    """Child process: the server and learner ends of the measurements."""
    for module in ("policy.inference_server", "learners.learner_worker"):
        importlib.import_module(module)  # JAX and the workers, before any timing

    with tempfile.TemporaryDirectory(prefix="srl_overhead_sink_") as tmp:
        conn.send("ready")
        while (command := conn.recv()) != "quit":
            role, case = command
            root = Path(tmp) / f"{role}-{case['name']}"
            CHILD_ROLES[role](conn, case, root)


class Sink:
    """The child process of the measurements, stopped by its pid."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")  # the child imports JAX; never fork
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=sink_main, args=(child_conn,), daemon=True,
                                       name="overhead-sink")
        self.process.start()
        child_conn.close()
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv() != "ready":
            self.close()
            raise BenchError("the overhead child did not start")

    def call(self, message: Any, timeout_s: float = 60.0) -> Any:
        """Send a command to the child and return its answer."""
        self.conn.send(message)
        if not self.conn.poll(timeout_s):
            raise BenchError(f"the overhead child did not answer {message!r}")
        return self.conn.recv()

    def close(self) -> None:
        """Ask the child to quit; SIGTERM, then SIGKILL, its pid if it does not."""
        with contextlib.suppress(OSError, BrokenPipeError):
            if self.process.is_alive():
                self.conn.send("quit")
        self.process.join(5)
        if self.process.is_alive():
            self.process.terminate()  # SIGTERM to its pid
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
