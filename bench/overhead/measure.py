"""The measuring ends of the overhead measurements, in this process: actors' requests to
the child's server and chunks into its learner intake, timed by CPU and wall clock."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from actors.actor_worker import ActorWorker
from actors.env_ring import ChunkBuilder, StepResult
from actors.envs import policy_spec
from bench.harness.launcher import BenchError
from bench.overhead.cases import IN_FLIGHT, OBS_CASES, TRAJECTORY, WINDOWS, micro_config
from bench.overhead.shared_slots import SlotSegment, doorbell_path, reply_path
from bench.overhead.sink import Sink, own_shared_memory
from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.dataflow.shm_layouts import reply_layout, request_layout
from srl_jax.runtime.shm_attach import SCHEME
from srl_jax.wire.names import FileNameService
from srl_jax.wire.shm.channels import Outbox
from srl_jax.wire.shm.layout import REQUEST_SLOTS
from srl_jax.wire.shm.place import OWNER_ENV, OwnerDirectory
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send


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


def _measured(sink: Sink, ask_all: Callable[[], None], run: Callable[[float], int],
              seconds: float) -> list[tuple[Window, Window, int]]:
    """Ask, warm up (connections, first batches), then WINDOWS windows of `seconds`
    between marks: (start, end, answers read) of each."""
    ask_all()
    run(min(0.3, seconds / 3))
    marks, answers = [_mark(sink)], []
    for window in range(WINDOWS):
        answers.append(run(seconds))
        marks.append(_mark(sink, "end" if window == WINDOWS - 1 else "mark"))
    return [(marks[i], marks[i + 1], answers[i]) for i in range(WINDOWS)]


def _median_window(case: dict[str, Any], role: str, name: str, request_bytes: int,
                   windows: list[tuple[Window, Window, int]]) -> dict[str, Any]:
    """The figures of the window with the median server CPU per request (a shared
    machine's bursts land in one window, not in the figure)."""
    figures = sorted((_request_figures(case, role, name, request_bytes, *window)
                      for window in windows), key=lambda f: f["server_cpu_us_per_request"])
    return {**figures[len(figures) // 2], "windows": len(figures),
            "server_cpu_us_per_request_windows": [f["server_cpu_us_per_request"]
                                                  for f in figures]}


def request_overhead(sink: Sink, name: str, envs: int, in_flight: int,
                     seconds: float, role: str = "requests") -> dict[str, Any]:
    """Requests of `envs` rows from `in_flight` DEALERs (one each) to the real server loop
    (`role` "requests"), or to the bare pyzmq echo under it ("echo", "echo-ipc")."""
    obs_shape, obs_dtype = OBS_CASES[name]
    case = {"name": f"{role}-{name}-{in_flight}", "envs": envs, "in_flight": in_flight,
            "max_batch": envs * in_flight, "obs_shape": list(obs_shape),
            "obs_dtype": obs_dtype, "ipc": role == "echo-ipc"}
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
        windows = _measured(sink, lambda: [ask(d) for d in dealers], run, seconds)
    finally:
        for dealer in dealers:
            dealer.close()
    if rejects.count:
        raise BenchError(f"request measurement {case['name']}: {rejects.count} replies "
                         "rejected")
    return _median_window(case, role, name, int(obs.nbytes), windows)


def shm_request_overhead(sink: Sink, name: str, envs: int, in_flight: int,
                         seconds: float, owner: Path) -> dict[str, Any]:
    """Requests of `envs` rows from `in_flight` askers to the real server loop through
    shared memory (srl_jax/wire/shm/), as actors on its host send them: this process's
    slot file (one split per asker) and the server's doorbell."""
    obs_shape, obs_dtype = OBS_CASES[name]
    case = {"name": f"shm-{name}-{in_flight}", "envs": envs, "in_flight": in_flight,
            "splits": in_flight, "max_batch": envs * in_flight, "obs_shape": list(obs_shape),
            "obs_dtype": obs_dtype, "shared_memory": "on", "owner": str(owner)}
    bell = Path(sink.call(("requests", case)).removeprefix(SCHEME))
    config = micro_config(case)
    spec = policy_spec(config)
    outbox = Outbox(bell.with_suffix(""), [bell], REQUEST_SLOTS * in_flight,
                    request_layout(config, spec, DEFAULT_POLICY),
                    reply_layout(config, spec, DEFAULT_POLICY))
    poller = select.poll()
    poller.register(outbox.fileno(), select.POLLIN)
    obs = np.zeros((envs, *obs_shape), obs_dtype)
    rejects = RejectCounter()
    seqs = [0] * in_flight

    def ask(asker: int) -> None:
        seqs[asker] += 1
        slot = outbox.open_slot(range(REQUEST_SLOTS * asker, REQUEST_SLOTS * (asker + 1)))
        outbox.send(slot, {"split": asker, "seq": seqs[asker]}, {"obs": obs})

    def run(duration: float) -> int:
        answered, deadline = 0, time.perf_counter() + duration
        while time.perf_counter() < deadline:
            if outbox.replies.pending or poller.poll(100):
                while (reply := outbox.receive(rejects)) is not None:
                    answered += 1
                    ask(reply.meta["split"])
        return answered

    try:
        windows = _measured(sink, lambda: [ask(a) for a in range(in_flight)], run, seconds)
    finally:
        outbox.close()
    if rejects.count:
        raise BenchError(f"request measurement {case['name']}: {rejects.count} replies "
                         "rejected")
    return _median_window(case, "shm", name, int(obs.nbytes), windows)


def actor_overhead(sink: Sink, envs: int, seconds: float, shared_memory: str, owner: Path
                   ) -> dict[str, Any]:
    """A real actor (`ActorWorker`: its ring of null envs, its core, its sockets or slots)
    against a server acting with zeros and a learner's intake in the child: this
    process's CPU per env frame, the null env's steps included and apart."""
    obs_shape, obs_dtype = OBS_CASES["vector"]
    case = {"name": f"actor-{shared_memory}", "envs": envs, "obs_shape": list(obs_shape),
            "obs_dtype": obs_dtype, "shared_memory": shared_memory, "owner": str(owner)}
    names = FileNameService(Path(sink.call(("actor", case))))
    own_shared_memory(case)
    actor = ActorWorker(micro_config(case), 0, names.root.parent, names)
    try:
        actor.setup()

        def run(duration: float) -> None:
            deadline = time.perf_counter() + duration
            while time.perf_counter() < deadline:
                actor.run_once()

        run(min(0.5, seconds / 3))
        frames, env_s = actor.core.env_frames, actor.core.time_env
        start = _mark(sink)
        run(seconds)
        end = _mark(sink, "end")
        frames, env_s = actor.core.env_frames - frames, actor.core.time_env - env_s
    finally:
        actor.close()
        os.environ.pop(OWNER_ENV, None)
    if frames <= 0 or actor.rejects.count or end.child["rejected"]:
        raise BenchError(f"actor measurement {case['name']}: {frames} frames, "
                         f"{actor.rejects.count} replies and {end.child['rejected']} chunks "
                         "rejected")
    cpu_s = end.cpu_s - start.cpu_s
    return {"transport": "shared memory" if shared_memory == "on" else "zmq", "rows": envs,
            "frames_per_s": frames / (end.wall - start.wall),
            "actor_cpu_us_per_frame": 1e6 * cpu_s / frames,
            "actor_runtime_us_per_frame": 1e6 * (cpu_s - env_s) / frames,
            "env_us_per_frame": 1e6 * env_s / frames}


def shared_memory_floor(sink: Sink, envs: int, in_flight: int, seconds: float
                        ) -> dict[str, Any]:
    """Requests of `envs` CartPole rows from `in_flight` askers to the bare shared-memory
    echo (bench/overhead/shared_slots.py): the floor of a same-host transport without
    ZMQ, beside the pyzmq floors."""
    name, role = "vector", "shm-echo"
    obs_shape, obs_dtype = OBS_CASES[name]
    case = {"name": f"{role}-{name}-{in_flight}", "envs": envs, "in_flight": in_flight,
            "obs_shape": list(obs_shape), "obs_dtype": obs_dtype}
    where = sink.call((role, case))
    segment = SlotSegment.map(Path(where["segment"]), case, create=False)
    doorbell = os.open(doorbell_path(Path(where["fifos"])), os.O_WRONLY)
    replies = [os.open(reply_path(Path(where["fifos"]), i), os.O_RDONLY | os.O_NONBLOCK)
               for i in range(in_flight)]
    asker_of = {fd: i for i, fd in enumerate(replies)}
    poller = select.poll()
    for fd in replies:
        poller.register(fd, select.POLLIN)
    obs = np.zeros((envs, *obs_shape), obs_dtype)

    def ask(asker: int) -> None:
        segment.requests[asker] = obs
        os.write(doorbell, bytes([asker]))

    def run(duration: float) -> int:
        answered, deadline = 0, time.perf_counter() + duration
        while time.perf_counter() < deadline:
            for fd, _ in poller.poll(100):
                for _ in os.read(fd, 64):
                    segment.replies[asker_of[fd]].copy()  # the reply taken out
                    answered += 1
                    ask(asker_of[fd])
        return answered

    try:
        windows = _measured(sink, lambda: [ask(a) for a in range(in_flight)], run, seconds)
    finally:
        for fd in (doorbell, *replies):
            os.close(fd)
    return _median_window(case, role, name, int(obs.nbytes), windows)


def _request_figures(case: dict[str, Any], role: str, name: str, request_bytes: int,
                     start: Window, end: Window, answered: int) -> dict[str, Any]:
    """A request measurement's figures from its two marks."""
    obs_shape, obs_dtype = OBS_CASES[name]
    envs, in_flight = case["envs"], case["in_flight"]
    wall = end.wall - start.wall
    requests = end.child["requests"] - start.child["requests"]
    batches = max(end.child["batches"] - start.child["batches"], 1)
    if requests <= 0 or answered <= 0:
        raise BenchError(f"request measurement {case['name']}: {requests} requests served, "
                         f"{answered} answers read")
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
        "server_zmq_io_us_per_request": 1e6 * max(server_cpu - server_python, 0.0) / requests,
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
    """Per request and per sample, for each observation case, and per actor frame, over
    ZeroMQ and through shared memory, `seconds` each."""
    sink = Sink()
    owner = OwnerDirectory()
    try:
        requests, samples, actors = [], [], []
        for name in OBS_CASES:
            requests.append(request_overhead(sink, name, envs, 1, seconds))
            requests.append(request_overhead(sink, name, envs, IN_FLIGHT, seconds))
            requests.append(shm_request_overhead(sink, name, envs, IN_FLIGHT, seconds,
                                                 owner.path))
            samples.append(sample_overhead(sink, name, envs, seconds))
        for floor in ("echo", "echo-ipc"):
            requests.append(request_overhead(sink, "vector", envs, IN_FLIGHT, seconds, floor))
        requests.append(shared_memory_floor(sink, envs, IN_FLIGHT, seconds))
        for shared_memory in ("off", "on"):
            actors.append(actor_overhead(sink, envs, seconds, shared_memory, owner.path))
    finally:
        sink.close()
        owner.remove()
    return {"requests": requests, "samples": samples, "actors": actors}
