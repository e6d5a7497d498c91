"""What the scaling sweep found: where throughput and the CPU saturate, the tables, and
the headline of the overheads with the actor cost the sweep measured."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from bench.harness.machine import nproc
from bench.overhead import summary as overhead_summary
from bench.scale.sweep import Point

SATURATION = 0.9
"""A server count saturates at the fewest actors that reach this share of its best fps."""
CPU_FULL = 0.9
"""The machine's CPU counts as full when the run's processes use this share of it."""


def mark_saturation(points: list[Point]) -> dict[str, Any]:
    """Per server count: where throughput stops growing, and where the CPU is full.

    Throughput saturates at the fewest actors that reach SATURATION of that server
    count's best fps (not reached while the last point is the first to get there);
    the CPU is full at the fewest actors whose processes use CPU_FULL of the machine.
    """
    found: dict[str, Any] = {}
    for servers in sorted({p.servers for p in points}):
        group = sorted((p for p in points if p.servers == servers), key=lambda p: p.actors)
        best = max(p.fps for p in group)
        flat = next(p for p in group if p.fps >= SATURATION * best)
        flat.saturated = flat is not group[-1]
        full = next((p for p in group if p.cpu_total_frac >= CPU_FULL), None)
        if full:
            full.cpu_full = True
        found[str(servers)] = {
            "actors": flat.actors if flat.saturated else None, "fps": flat.fps,
            "best_fps": best, "best_actors": max(group, key=lambda p: p.fps).actors,
            "cpu_full_actors": full.actors if full else None,
            "fps_growth": {f"{a.actors}->{b.actors}": b.fps / a.fps - 1
                           for a, b in itertools.pairwise(group)},
        }
    return found


def print_sweep(points: list[Point]) -> None:
    header = (f"{'actors':>6} {'srv':>3} {'fps':>9} {'req/s':>8} {'rows/b':>6} {'lat_ms':>6} "
              f"{'wait':>5} {'smp/s':>9} {'chunk/s':>7} {'srv_us/req':>10} {'(policy)':>8} "
              f"{'lrn_us/smp':>10} {'act_us/frm':>10} {'cpu':>5}")
    print(header)
    print("-" * len(header))
    for p in points:
        print(f"{p.actors:>6} {p.servers:>3} {p.fps:>9,.0f} {p.inference_requests_per_s:>8,.0f} "
              f"{p.rows_per_batch:>6.1f} {p.request_latency_ms:>6.2f} {p.actor_wait_frac:>5.2f} "
              f"{p.stream_samples_per_s:>9,.0f} {p.stream_chunks_per_s:>7,.0f} "
              f"{p.server_cpu_us_per_request:>10.1f} {p.server_compute_us_per_request:>8.1f} "
              f"{p.learner_cpu_us_per_sample:>10.2f} "
              f"{p.actor_cpu_us_per_frame:>10.2f} {p.cpu_total_frac:>5.0%}"
              + ("  <- throughput saturated" if p.saturated else "")
              + ("  <- CPU full" if p.cpu_full else ""))
    print("  fps: env frames/s; req/s: inference requests/s; rows/b: rows per batch; lat_ms: "
          "request round trip seen by the actor; wait: actor time waiting; smp/s, chunk/s: "
          "sample stream into the learner; *_us: CPU us per request (servers; policy: wall us "
          "of it in the jitted policy call), per sample (learner, update included), per frame "
          "(actors); cpu: all the run's processes' CPU over nproc x wall")


def headline(overheads: dict[str, Any] | None, points: list[Point]) -> dict[str, Any]:
    """The overhead headline (`bench.overhead.summary.headline`), and with the sweep's
    points how many actor cores (at the measured actor CPU per frame of this cheap env:
    the worst case) one server core and one learner intake feed."""
    if not overheads:
        return {}
    head: dict[str, Any] = overhead_summary.headline(overheads)
    per_frame = statistics.median(p.actor_cpu_us_per_frame for p in points) if points else None
    if per_frame:
        frames_per_core = 1e6 / per_frame
        head.update({
            "actor_core_frames_per_s": frames_per_core,
            "actor_cores_per_server_core": head["server_core_rows_per_s"] / frames_per_core,
            "actor_cores_per_learner_intake": head["learner_intake_samples_per_s"]
            / frames_per_core,
        })
    return head


def print_headline(head: dict[str, Any], rows: int) -> None:
    overhead_summary.print_headline(head, rows)
    if "actor_core_frames_per_s" in head:
        print(f"an actor core steps {head['actor_core_frames_per_s']:,.0f} frames/s of this "
              f"env (median over the sweep): one server core feeds "
              f"{head['actor_cores_per_server_core']:.1f} actor cores, one learner's intake "
              f"{head['actor_cores_per_learner_intake']:.0f}")


def print_saturation(saturation: dict[str, Any]) -> None:
    for servers, s in saturation.items():
        growth = ", ".join(f"{step} {g:+.0%}" for step, g in s["fps_growth"].items())
        if s["actors"] is not None:
            where = (f"throughput stops growing at {s['actors']} actors ({s['fps']:,.0f} of at "
                     f"most {s['best_fps']:,.0f} frames/s)")
        else:
            where = (f"throughput still grows at {s['best_actors']} actors "
                     f"({s['best_fps']:,.0f} frames/s)")
        cpu = (f"CPU full (>= {CPU_FULL:.0%} of {nproc()} cores) from {s['cpu_full_actors']} "
               "actors" if s["cpu_full_actors"] else "CPU never full")
        print(f"{servers} server(s): {where}; {cpu}; fps growth {growth}")


def plain(value: Any) -> Any:
    """JSON-ready: floats rounded, NaN as null (strict JSON has no NaN)."""
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value
