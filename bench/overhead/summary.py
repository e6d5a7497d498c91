"""The overhead figures as tables, and the headline: what one server core and one
learner's intake take at most besides policy compute and updates."""

from __future__ import annotations

from typing import Any

from bench.overhead.cases import IN_FLIGHT


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
          "under the runtime's figure ('echo-ipc': the same over ipc://; 'shm-echo': "
          "slots in shared memory and FIFO doorbells carrying slot indices, no ZMQ; "
          "'shm': the real server through the runtime's shared memory, what actors on its "
          "host use by default; 'requests': the real server over loopback TCP)")
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


def print_actors(actors: list[dict[str, Any]]) -> None:
    print(f"{'transport':>14} {'rows':>4} {'frames/s':>10} {'actor_us':>8} {'runtime_us':>10} "
          f"{'env_us':>7}")
    for a in actors:
        print(f"{a['transport']:>14} {a['rows']:>4} {a['frames_per_s']:>10,.0f} "
              f"{a['actor_cpu_us_per_frame']:>8.2f} {a['actor_runtime_us_per_frame']:>10.2f} "
              f"{a['env_us_per_frame']:>7.2f}")
    print("  actor_us: CPU us per env frame of a real actor (one split of null envs) against "
          "a server acting with zeros and a learner's intake; runtime_us: the same without "
          "the envs' own steps (env_us)")


def headline(overheads: dict[str, Any]) -> dict[str, float]:
    """The headline figures (`vector`: server CPU per request with IN_FLIGHT requests in
    flight, learner CPU per sample, actor CPU per frame) for the transport actors on the
    server's host use by default (shared memory), beside ZeroMQ's, and what one server
    core and one learner's intake take at most besides policy compute and updates."""
    request, request_zmq, floor, floor_ipc, floor_shm = (
        next(r for r in overheads["requests"] if r.get("server", "requests") == server
             and r["obs"] == "vector" and r["in_flight"] == IN_FLIGHT)
        for server in ("shm", "requests", "echo", "echo-ipc", "shm-echo"))
    sample = next(s for s in overheads["samples"] if s["obs"] == "vector")
    actor, actor_zmq = (next(a for a in overheads["actors"] if a["transport"] == transport)
                        for transport in ("shared memory", "zmq"))
    per_request, per_sample = request["server_cpu_us_per_request"], \
        sample["learner_cpu_us_per_sample"]
    return {
        "transport": "shared memory",
        "server_us_per_request": per_request,
        "actor_us_per_frame": actor["actor_cpu_us_per_frame"],
        "server_us_per_request_zmq": request_zmq["server_cpu_us_per_request"],
        "actor_us_per_frame_zmq": actor_zmq["actor_cpu_us_per_frame"],
        "actor_runtime_us_per_frame": actor["actor_runtime_us_per_frame"],
        "per_request_overhead_us": per_request,
        "per_request_overhead_us_per_row": per_request / request["rows"],
        "per_request_actor_side_us": request["actor_cpu_us_per_request"],
        "per_request_zmq_floor_us": floor["server_cpu_us_per_request"],
        "per_request_zmq_floor_ipc_us": floor_ipc["server_cpu_us_per_request"],
        "per_request_shm_floor_us": floor_shm["server_cpu_us_per_request"],
        "per_request_shm_floor_actor_side_us": floor_shm["actor_cpu_us_per_request"],
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
    print(f"default transport on one host ({head['transport']}): server "
          f"{head['server_us_per_request']:.1f} us per request (ZeroMQ: "
          f"{head['server_us_per_request_zmq']:.1f}), actor {head['actor_us_per_frame']:.2f} us "
          f"per frame (ZeroMQ: {head['actor_us_per_frame_zmq']:.2f})")
    print(f"per-request overhead: {head['per_request_overhead_us']:.1f} us of server CPU per "
          f"request of {rows} rows ({head['per_request_overhead_us_per_row']:.2f} us/row), "
          f"{head['per_request_actor_side_us']:.1f} us on the actor side (bare pyzmq's "
          f"floor: {head['per_request_zmq_floor_us']:.1f} us, over ipc:// "
          f"{head['per_request_zmq_floor_ipc_us']:.1f} us; shared memory's without ZMQ: "
          f"{head['per_request_shm_floor_us']:.1f} us, "
          f"{head['per_request_shm_floor_actor_side_us']:.1f} us on the actor side), round trip "
          f"{head['per_request_round_trip_us']:.0f} us; one server core answers at most "
          f"{head['server_core_requests_per_s']:,.0f} requests/s "
          f"({head['server_core_rows_per_s']:,.0f} rows/s) besides its policy compute")
    print(f"per-sample overhead: {head['per_sample_overhead_us']:.3f} us of learner CPU per "
          f"sample, {head['per_sample_actor_side_us']:.3f} us on the actor side; one learner's "
          f"intake takes at most {head['learner_intake_samples_per_s']:,.0f} samples/s "
          "besides its update")
