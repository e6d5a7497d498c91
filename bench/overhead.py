"""Overhead microbenchmark: the runtime's CPU per inference request and per sample.

The figures that bound scale on a real cluster, measured with the runtime's
own code over real loopback TCP sockets between this process and one child
process (spawned, and stopped by its pid):

- *per inference request*: this process plays the actors: DEALER sockets send
  `infer_request` messages (`srl_jax.core.streams.send`, the real wire encoding)
  of `--envs` rows and read the replies (`streams.receive`). The child runs a
  real `InferenceServer`, built by its constructor and its `setup`, whose
  policy runner acts with zeros instead of the jitted network (its
  `runner_factory`), so what is left is the runtime's work: gathering,
  batching, padding, replying. Measured: the server process's CPU time per
  request (its ZMQ I/O thread included) with 8 requests in flight, the actor
  side's CPU per request, and the wall round trip with one request in flight
  (max_batch = one request, so the server never waits for more).
- *per sample*: this process plays an actor: it fills trajectory chunks with
  the actor's `ChunkBuilder` (T x n steps, the real chunk layout) and pushes
  them on the sample stream (`streams.send`, blocking like
  `actors.send_policy=block`). The child runs the learner's intake (receive,
  decode, check against the chunk layout, sample queue, batch assembly,
  `put_batch` onto the device) without an update. Measured: CPU per sample
  (one env step) on each side, and per chunk.

Both for CartPole's observation (float32 [4]) and for Atari-sized frames
(uint8 [84, 84, 4]), given to the server and the learner by the env they are
configured with (`bench/null_env.py` with that observation).

Run from the repository root::

    .venv/bin/python bench/overhead.py             # about 20 s
    .venv/bin/python bench/overhead.py --seconds 0.3

It prints the figures; `bench/scale.py` runs the same measurements before its
sweep and writes them to bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_fps import REPO_ROOT, BenchError, raise_on_sigterm

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
from actors.env_ring import ChunkBuilder, StepResult
from actors.envs import policy_spec
from srl_jax.core.stream_table import PARAMS, SAMPLES
from srl_jax.core.streams import RejectCounter, make_socket, receive, send

NULL_ENV = "bench.null_env:NullEnv-v0"
TRAJECTORY = 32
"""T of the per-sample measurement's chunks (and of bench/scale.py's sweep)."""
BATCH_CHUNKS = 4
"""Chunks per learner batch (learner.batch_envs = 4 x the columns of a chunk)."""
IN_FLIGHT = 8
"""Requests in flight (one per simulated actor) for the server's CPU per request."""
START_TIMEOUT_S = 150.0
OBS_CASES: dict[str, tuple[tuple[int, ...], str]] = {
    "vector": ((4,), "float32"),
    "frames": ((84, 84, 4), "uint8"),
}
"""Observations of the measurements: CartPole's and Atari's."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/overhead.py",
        description="The runtime's CPU per inference request and per sample, over real "
                    "sockets, without policy compute or updates.")
    parser.add_argument("--envs", type=int, default=16,
                        help="rows per request and columns per chunk (default: 16)")
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="seconds of each measurement (default: 1.5)")
    args = parser.parse_args(argv)
    if args.envs < 1 or args.seconds <= 0:
        parser.error("--envs and --seconds must be positive")
    return args


# -------------------------------------------------------------------- child


def _zero_act(params: Any, obs: np.ndarray, state: np.ndarray, mask: np.ndarray, key: Any,
              counter: Any) -> np.ndarray:
    """Stands in for the jitted network, no JAX call: `pack_outputs`' layout for a
    discrete action (log-probability, value, action: zeros), then the state as it came."""
    return np.concatenate([np.zeros((obs.shape[0], 3), np.float32), state], axis=1)


def zero_runner(config: Any, spec: Any, sampling_seed: int, min_size: int,
                max_size: int) -> Any:
    """A policy runner that acts with `_zero_act`, its (empty) parameters already
    taken, so that the server does not wait for a learner's."""
    from learners.models.policy_runner import PolicyRunner, padded_sizes

    runner = PolicyRunner(_zero_act, {}, spec, padded_sizes(min_size, max_size), sampling_seed)
    runner.set_params({}, version=0)
    return runner


def micro_config(case: dict[str, Any]) -> Any:
    """The experiment config of one measurement: the null env with the case's observation."""
    from srl_jax.config.schema import (
        ActorConfig,
        EnvConfig,
        ExperimentConfig,
        InferenceConfig,
        LearnerConfig,
    )

    return ExperimentConfig(
        env=EnvConfig(id=NULL_ENV, kwargs={"obs_shape": list(case["obs_shape"]),
                                           "obs_dtype": case["obs_dtype"]}),
        actors=ActorConfig(envs=case["envs"], splits=1, trajectory_length=TRAJECTORY),
        inference=InferenceConfig(max_batch=case.get("max_batch", case["envs"]),
                                  min_padded_batch=1),
        # No update runs, so versions never matter: nothing is ever stale. A short
        # queue bounds memory with Atari-sized chunks (15 MB each).
        learner=LearnerConfig(batch_envs=case["envs"] * BATCH_CHUNKS, sample_queue=8,
                              staleness_cap=10**9, devices=1))


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


def _serve_requests(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """A real inference server acting with zeros, until the parent says 'end'."""
    from learners.workers.inference_server import InferenceServer
    from srl_jax.core.names import FileNameService
    from srl_jax.core.transport import Transport

    names = FileNameService(root / "names")
    context = zmq.Context.instance()
    # the learner's end, which sends nothing
    learner_params = make_socket(context, PARAMS.bind_type)
    Transport(context).bind(learner_params, names, PARAMS.key())
    server = InferenceServer(micro_config(case), 0, root, names, runner_factory=zero_runner)
    try:
        server.setup()
        conn.send(server.endpoint)
        _until_end(conn, server.run_once, server.counters)
    finally:
        server.close()
        learner_params.close()


def _echo_requests(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """The floor under the server: plain pyzmq, no runtime code. A ROUTER socket
    answers each request with the same reply (encoded once: one row per request row)
    as soon as it arrives, until the parent says 'end'. Over loopback TCP, or over
    `ipc://` (a Unix socket under `root`) with `case["ipc"]`: what co-located actors
    and servers would gain from it."""
    from learners.workers.inference_server import POLL_MS
    from srl_jax.core.wire import encode

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


def _take_samples(conn: Connection, case: dict[str, Any], root: Path) -> None:
    """The learner's intake without an update, until the parent says 'end'.

    Built from the learner's public parts (its `SampleIntake`, the mesh); it
    follows `LearnerWorker.run_once` up to the update.
    """
    import jax

    from learners.algorithms.train_state import to_batch
    from learners.training.mesh import make_learner_mesh, put_batch
    from learners.training.sample_queue import SampleQueue
    from learners.workers.learner_worker import POLL_MS
    from learners.workers.sample_intake import SampleIntake
    from srl_jax.core.chunk_spec import run_chunk_layout
    from srl_jax.core.names import FileNameService
    from srl_jax.core.transport import Transport

    config = micro_config(case)
    cfg = config.learner
    rejects = RejectCounter()
    intake = SampleIntake(run_chunk_layout(config, policy_spec(config)),
                          SampleQueue(cfg.sample_queue, cfg.batch_envs, cfg.staleness_cap),
                          rejects)
    mesh = make_learner_mesh(cfg.devices, cfg.batch_envs)
    context = zmq.Context.instance()
    pull = make_socket(context, SAMPLES.bind_type, hwm=cfg.sample_queue)
    endpoint = Transport(context).bind(pull, FileNameService(root / "names"), SAMPLES.key(index=0))

    def prefetch() -> Any:
        """The next batch on its way to the device (None while too few chunks wait)."""
        batch = intake.take_batch(0)
        return None if batch is None else put_batch(to_batch(batch), mesh)

    on_device = None

    def step() -> None:
        nonlocal on_device
        if pull.poll(0 if on_device is not None else POLL_MS):
            intake.drain(pull, 0)
        if on_device is None:
            on_device = prefetch()
        if on_device is not None:
            jax.block_until_ready(on_device)  # where the update would run
            on_device = prefetch()  # overlaps the transfer with the next receive

    conn.send(endpoint)
    try:
        _until_end(conn, step, lambda: {"frames_received": intake.frames_received,
                                        "frames_consumed": intake.frames_consumed,
                                        "rejected": rejects.count})
    finally:
        pull.close()


CHILD_ROLES = {"requests": _serve_requests, "echo": _echo_requests,
               "echo-ipc": _echo_requests, "samples": _take_samples}


def sink_main(conn: Connection) -> None:
    """Child process: the server and learner ends of the measurements."""
    for module in ("learners.workers.inference_server", "learners.workers.learner_worker"):
        importlib.import_module(module)  # JAX and the workers, before any timing

    with tempfile.TemporaryDirectory(prefix="srl_overhead_sink_") as tmp:
        conn.send("ready")
        while (command := conn.recv()) != "quit":
            role, case = command
            root = Path(tmp) / f"{role}-{case['name']}"
            CHILD_ROLES[role](conn, case, root)


# ------------------------------------------------------------------- parent


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


@dataclass
class Window:
    """This process's clock and CPU time when it asked, and the child's answer."""

    wall: float
    cpu_s: float
    child: dict[str, float]


def _mark(sink: Sink, message: str = "mark") -> Window:
    """Clock and CPU as the command goes out: the child answers after its current step,
    which may wait out a poll once the traffic has stopped."""
    wall, cpu_s = time.perf_counter(), time.process_time()
    return Window(wall, cpu_s, sink.call(message))
def request_overhead(sink: Sink, name: str, envs: int, in_flight: int,
                     seconds: float, role: str = "requests") -> dict[str, Any]:
    """Requests of `envs` rows from `in_flight` DEALERs (one each) to the real server loop
    (`role` "requests"), or to the bare pyzmq echo under it ("echo", "echo-ipc")."""
    obs_shape, obs_dtype = OBS_CASES[name]
    case = {"name": f"{role}-{name}-{in_flight}", "envs": envs, "max_batch": envs * in_flight,
            "obs_shape": list(obs_shape), "obs_dtype": obs_dtype, "ipc": role == "echo-ipc"}
    endpoint = sink.call((role, case))
    context = zmq.Context.instance()
    dealers = [make_socket(context, zmq.DEALER) for _ in range(in_flight)]
    poller = zmq.Poller()
    for dealer in dealers:
        dealer.connect(endpoint)
        poller.register(dealer, zmq.POLLIN)
    obs = np.zeros((envs, *obs_shape), obs_dtype)
    rejects = RejectCounter()
    seqs = dict.fromkeys(dealers, 0)

    def ask(dealer: zmq.Socket) -> None:
        seqs[dealer] += 1
        send(dealer, "infer_request", {"split": 0, "seq": seqs[dealer]}, {"obs": obs})

    def run(duration: float) -> int:
        answered, deadline = 0, time.perf_counter() + duration
        while time.perf_counter() < deadline:
            for dealer, _ in poller.poll(100):
                while receive(dealer, frozenset({"infer_reply"}), rejects) is not None:
                    answered += 1
                    ask(dealer)
        return answered

    try:
        for dealer in dealers:
            ask(dealer)
        run(min(0.3, seconds / 3))  # warm-up: connections, first batches
        start = _mark(sink)
        answered = run(seconds)
        end = _mark(sink, "end")
    finally:
        for dealer in dealers:
            dealer.close()
    wall = end.wall - start.wall
    requests = end.child["requests"] - start.child["requests"]
    batches = max(end.child["batches"] - start.child["batches"], 1)
    if requests <= 0 or answered <= 0 or rejects.count:
        raise BenchError(f"request measurement {case['name']}: {requests} requests served, "
                         f"{rejects.count} replies rejected")
    request_bytes = int(obs.nbytes)
    server_cpu = end.child["cpu_s"] - start.child["cpu_s"]
    server_python = end.child["thread_cpu_s"] - start.child["thread_cpu_s"]
    return {
        "server": role, "obs": name, "obs_shape": list(obs_shape), "obs_dtype": obs_dtype,
        "rows": envs,
        "request_bytes": request_bytes, "in_flight": in_flight,
        "requests_per_s": requests / wall, "requests_per_batch": requests / batches,
        "round_trip_us": 1e6 * wall * in_flight / answered,
        "server_cpu_us_per_request": 1e6 * server_cpu / requests,
        "server_python_us_per_request": 1e6 * server_python / requests,
        "server_zmq_io_us_per_request": 1e6 * (server_cpu - server_python) / requests,
        "actor_cpu_us_per_request": 1e6 * (end.cpu_s - start.cpu_s) / answered,
    }


def sample_overhead(sink: Sink, name: str, envs: int, seconds: float) -> dict[str, Any]:
    """Chunks of T x `envs` steps from the actor's ChunkBuilder into the real learner loop."""
    obs_shape, obs_dtype = OBS_CASES[name]
    case = {"name": name, "envs": envs, "obs_shape": list(obs_shape), "obs_dtype": obs_dtype}
    endpoint = sink.call(("samples", case))
    push = make_socket(zmq.Context.instance(), zmq.PUSH, hwm=4)  # actors.send_queue
    push.connect(endpoint)
    first = np.zeros((envs, *obs_shape), obs_dtype)
    builder = ChunkBuilder(TRAJECTORY, first, policy_spec(micro_config(case)))
    step = StepResult(np.ones(envs, np.float32), np.zeros(envs, bool), np.zeros(envs, bool),
                      first, np.empty(0, np.int64), np.empty((0, *obs_shape), obs_dtype))
    action, values = np.zeros(envs, np.int32), np.zeros(envs, np.float32)
    no_values = np.empty(0, np.float32)
    no_state = np.zeros((envs, 0), np.float32)
    chunk_bytes = 0

    def run(duration: float) -> int:
        nonlocal chunk_bytes
        steps = 0
        deadline = time.perf_counter() + duration
        while time.perf_counter() < deadline:
            chunk = builder.on_policy(action, values, values, 0, no_values, no_state)
            if chunk is not None:
                chunk_bytes = sum(a.nbytes for a in chunk.values())
                send(push, "samples", {"actor": 0, "episode_returns": []}, chunk)
            builder.on_step(step)
            steps += 1
        return steps

    try:
        run(min(0.3, seconds / 3))
        start = _mark(sink)
        steps = run(seconds)
        end = _mark(sink, "end")
    finally:
        push.close()
    wall = end.wall - start.wall
    received = end.child["frames_received"] - start.child["frames_received"]
    if received <= 0 or end.child["rejected"]:
        raise BenchError(f"sample measurement {name}: {received} samples received, "
                         f"{end.child['rejected']} chunks rejected")
    chunk_samples = TRAJECTORY * envs
    learner_us = 1e6 * (end.child["cpu_s"] - start.child["cpu_s"]) / received
    actor_us = 1e6 * (end.cpu_s - start.cpu_s) / (steps * envs)
    return {
        "obs": name, "obs_shape": list(obs_shape), "obs_dtype": obs_dtype,
        "chunk": f"[{TRAJECTORY}+1, {envs}]", "chunk_samples": chunk_samples,
        "chunk_bytes": chunk_bytes, "samples_per_s": received / wall,
        "chunks_per_s": received / chunk_samples / wall,
        "learner_cpu_us_per_sample": learner_us,
        "learner_cpu_us_per_chunk": learner_us * chunk_samples,
        "actor_cpu_us_per_sample": actor_us, "actor_cpu_us_per_chunk": actor_us * chunk_samples,
        "samples_consumed_frac": (end.child["frames_consumed"] - start.child["frames_consumed"])
        / received,
    }


def measure_overheads(envs: int, seconds: float) -> dict[str, Any]:
    """Per request and per sample, for each observation case, `seconds` each."""
    sink = Sink()
    try:
        requests, samples = [], []
        for name in OBS_CASES:
            requests.append(request_overhead(sink, name, envs, 1, seconds))
            requests.append(request_overhead(sink, name, envs, IN_FLIGHT, seconds))
            samples.append(sample_overhead(sink, name, envs, seconds))
        for floor in ("echo", "echo-ipc"):
            requests.append(request_overhead(sink, "vector", envs, IN_FLIGHT, seconds, floor))
    finally:
        sink.close()
    return {"requests": requests, "samples": samples}


# ------------------------------------------------------------------- output


def print_overheads(overheads: dict[str, Any]) -> None:
    print(f"{'server':>8} {'obs':>7} {'rows':>4} {'bytes':>8} {'inflight':>8} {'req/s':>9} "
          f"{'req/batch':>9} {'rtt_us':>8} {'server_us':>9} {'(python':>8} {'io)':>6} "
          f"{'actor_us':>8}")
    for r in overheads["requests"]:
        print(f"{r.get('server', 'requests'):>8} {r['obs']:>7} {r['rows']:>4} "
              f"{r['request_bytes']:>8,} {r['in_flight']:>8} "
              f"{r['requests_per_s']:>9,.0f} {r['requests_per_batch']:>9.1f} "
              f"{r['round_trip_us']:>8.0f} {r['server_cpu_us_per_request']:>9.1f} "
              f"{r['server_python_us_per_request']:>8.1f} "
              f"{r['server_zmq_io_us_per_request']:>6.1f} {r['actor_cpu_us_per_request']:>8.1f}")
    print("  server_us: CPU us per request of the server process with a stub policy (python: "
          "its main thread; io: other threads, chiefly ZMQ's I/O thread); actor_us: the same "
          "on the asking side; rtt_us: wall time per request and request in flight; "
          "server 'echo': bare pyzmq answering each request with a fixed reply, the floor "
          "under the runtime's figure ('echo-ipc': the same over ipc://)")
    print(f"{'obs':>7} {'chunk':>9} {'MB':>6} {'samples/s':>10} {'chunks/s':>8} "
          f"{'learner_us':>10} {'actor_us':>8} {'learner_us/chunk':>16}")
    for s in overheads["samples"]:
        print(f"{s['obs']:>7} {s['chunk']:>9} {s['chunk_bytes'] / 1e6:>6.2f} "
              f"{s['samples_per_s']:>10,.0f} {s['chunks_per_s']:>8,.0f} "
              f"{s['learner_cpu_us_per_sample']:>10.3f} {s['actor_cpu_us_per_sample']:>8.3f} "
              f"{s['learner_cpu_us_per_chunk']:>16.0f}")
    print("  learner_us: CPU us per sample (one env step) of the learner process without its "
          "update (receive, check, queue, batch, put on the device); actor_us: the actor's "
          "chunk filling and sending")


def headline(overheads: dict[str, Any]) -> dict[str, float]:
    """The two headline figures (`vector`: server CPU per request with IN_FLIGHT requests
    in flight, learner CPU per sample), and what one server core and one learner's
    intake take at most besides policy compute and updates."""
    request, floor, floor_ipc = (
        next(r for r in overheads["requests"] if r.get("server", "requests") == server
             and r["obs"] == "vector" and r["in_flight"] == IN_FLIGHT)
        for server in ("requests", "echo", "echo-ipc"))
    sample = next(s for s in overheads["samples"] if s["obs"] == "vector")
    per_request, per_sample = request["server_cpu_us_per_request"], \
        sample["learner_cpu_us_per_sample"]
    return {
        "per_request_overhead_us": per_request,
        "per_request_overhead_us_per_row": per_request / request["rows"],
        "per_request_actor_side_us": request["actor_cpu_us_per_request"],
        "per_request_zmq_floor_us": floor["server_cpu_us_per_request"],
        "per_request_zmq_floor_ipc_us": floor_ipc["server_cpu_us_per_request"],
        "per_request_round_trip_us": next(
            r["round_trip_us"] for r in overheads["requests"]
            if r["obs"] == "vector" and r["in_flight"] == 1),
        "per_sample_overhead_us": per_sample,
        "per_sample_actor_side_us": sample["actor_cpu_us_per_sample"],
        "server_core_requests_per_s": 1e6 / per_request,
        "server_core_rows_per_s": 1e6 * request["rows"] / per_request,
        "learner_intake_samples_per_s": 1e6 / per_sample,
    }


def print_headline(head: dict[str, float], rows: int) -> None:
    print(f"per-request overhead: {head['per_request_overhead_us']:.1f} us of server CPU per "
          f"request of {rows} rows ({head['per_request_overhead_us_per_row']:.2f} us/row), "
          f"{head['per_request_actor_side_us']:.1f} us on the actor side (bare pyzmq's "
          f"floor: {head['per_request_zmq_floor_us']:.1f} us, over ipc:// "
          f"{head['per_request_zmq_floor_ipc_us']:.1f} us), round trip "
          f"{head['per_request_round_trip_us']:.0f} us; one server core answers at most "
          f"{head['server_core_requests_per_s']:,.0f} requests/s "
          f"({head['server_core_rows_per_s']:,.0f} rows/s) besides its policy compute")
    print(f"per-sample overhead: {head['per_sample_overhead_us']:.3f} us of learner CPU per "
          f"sample, {head['per_sample_actor_side_us']:.3f} us on the actor side; one learner's "
          f"intake takes at most {head['learner_intake_samples_per_s']:,.0f} samples/s "
          "besides its update")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    print(f"overheads: {args.seconds:g}s per measurement ...", flush=True)
    try:
        overheads = measure_overheads(args.envs, args.seconds)
    except BenchError as error:
        print(f"not measured: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print()
    print_overheads(overheads)
    print()
    print_headline(headline(overheads), args.envs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
