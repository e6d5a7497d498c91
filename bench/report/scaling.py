"""The scaling section from `bench.scale`'s results, and what they imply for a 1,000-core
run with the Atari step cost `bench.peers.compare --cases pong` measured."""

from __future__ import annotations

from typing import Any

from bench.report.markdown import machine_note, table


def atari_step_us(pong: dict[str, Any]) -> float:
    """A core's time per Atari agent step, from compare.py's raw ALE stepping (one
    process per core, all at once): cores x 1e6 / their summed steps/s."""
    return pong["machine"]["cores"] * 1e6 / pong["raw_env_steps_per_s"]


def scale(result: dict[str, Any], pong: dict[str, Any] | None = None) -> list[str]:
    """The scaling simulation: overheads, throughput against actors, and what they imply
    for a 1,000-core run, with the Atari step cost measured in compare_pong.json."""
    rows = [[str(p["actors"]), str(p["servers"]), f"{p['fps']:,.0f}",
             f"{p['inference_requests_per_s']:,.0f}", f"{p['rows_per_batch']:.1f}",
             f"{p['request_latency_ms']:.2f}", f"{p['stream_samples_per_s']:,.0f}",
             f"{p['server_cpu_us_per_request']:.0f}", f"{p['cpu_total_frac']:.2f}"]
            for p in result["sweep"]]
    servers = sorted({p["servers"] for p in result["sweep"]})
    lines = ["**Scaling simulation** (`python -m bench.scale`): actor processes stepping a "
             f"null env ({result['settings']['envs_per_actor']} envs each) against "
             f"{'-'.join(str(n) for n in dict.fromkeys([servers[0], servers[-1]]))} "
             f"inference server{'s' if servers[-1] > 1 else ''} and one learner, "
             f"{result['wall_s']:.0f} s in all:", ""]
    lines += table(["actors", "servers", "env frames/s", "requests/s", "rows/batch",
                     "latency ms", "samples/s", "server CPU us/request", "CPU used"], rows)
    best = {servers: s["best_actors"] for servers, s in result["saturation"].items()}
    request, sample = result["per_request_overhead_us"], result["per_sample_overhead_us"]
    per_core = result["server_core_requests_per_s"]
    rows = round(result["server_core_rows_per_s"] / per_core)
    actor_us = 1e6 / result["actor_core_frames_per_s"]
    peaks = ", ".join(f"{a} actors with {s} server(s)" for s, a in best.items())
    lines += ["", f"Throughput stops growing at {peaks} on this machine (its cores are "
              "full). Runtime overhead measured over real sockets "
              f"with the runtime's own code: **{request:.0f} us of server CPU per inference "
              f"request** ({rows} rows; {result['per_request_overhead_us_per_row']:.1f} us a "
              f"row{zmq_floor(result)}) and **{sample:.2f} us of learner CPU per sample** of "
              "a CartPole-sized chunk.", "",
              f"What that implies for a 1,000-core run: one server core answers about "
              f"{per_core:,.0f} requests/s before any policy compute, and an actor core spends "
              f"about {actor_us:.0f} us of runtime per env step. "
              f"{atari_projection(pong, actor_us, per_core, rows)}"
              f"One learner takes in about {result['learner_intake_samples_per_s'] / 1e6:.1f}M "
              "small samples/s, so its update, not the intake, bounds it; Atari frames cost "
              "far more per sample (see bench/README.md).", "", machine_note(result)]
    return lines


def zmq_floor(result: dict[str, Any]) -> str:
    """The bare pyzmq echo under the server's figure, where the results have it."""
    if "per_request_zmq_floor_us" not in result:
        return ""
    return (f"; bare pyzmq answering the same requests costs "
            f"{result['per_request_zmq_floor_us']:.0f} us over TCP and "
            f"{result['per_request_zmq_floor_ipc_us']:.0f} us over ipc://: the floor under it")


def atari_projection(pong: dict[str, Any] | None, actor_us: float, per_core: float,
                     rows: int) -> str:
    """What 1,000 actor cores of Atari would step and ask of the servers, with the step
    cost measured by compare.py's pong case (said so when it has not run)."""
    if pong is None:
        return ("(No Atari step cost measured yet: `python -m bench.peers.compare --cases pong` "
                "writes "
                "it.) ")
    atari_us = atari_step_us(pong)
    steps = 1000 * 1e6 / (atari_us + actor_us)
    requests = steps / rows
    return (f"With an Atari env step of {atari_us:.0f} us of a core (raw ALE Pong-v5 "
            f"stepping in `python -m bench.peers.compare --cases pong`: "
            f"{pong['raw_env_steps_per_s']:,.0f} agent steps/s from {pong['machine']['cores']} "
            f"processes on as many cores, "
            f"{pong['date']}, 1-min load average {pong['machine']['load_avg_1m']} at the "
            f"start), 1,000 actor cores make about {steps / 1e6:.1f}M steps/s and "
            f"{requests:,.0f} requests/s at {rows} rows each: about "
            f"{requests / per_core:.0f} server cores of runtime work, plus the policy compute "
            "on the accelerators. ")


def scaling_model(result: dict[str, Any]) -> list[str]:
    """`bench.scale.model`: the projection for each experiment, what it rests on, and the
    check against the whole runs measured."""
    settings = result["settings"]
    lines = ["![Projected throughput against CPU cores, and Atari against accelerators beside "
             "SRL's published scaling](img/scaling.svg)", ""]
    for name, title in (("cartpole", "CartPole PPO (inference on CPU servers)"),
                        ("atari", "Atari Pong IMPALA (inference on the accelerators)")):
        rows = [[f"{p['cores']:,}", str(p["accelerators"]), f"{p['fps']:,.0f}", p["bound_by"],
                 f"{p['bounds']['actor and server CPUs']:,.0f}",
                 f"{p['bounds']['learner accelerators']:,.0f}", f"{p['controller_cores']:.2f}",
                 str(p["relay_hops"]),
                 f"{p['version_arrival_s']:.2f} / {p['version_arrival_unfavourable_s']:.2f}",
                 f"{p['learner_link_bytes_per_version'] / 1e6:,.1f}",
                 f"{p['unrelayed_bytes_per_version'] / 1e6:,.1f}"]
                for p in result["curves"][name]]
        lines += [f"**{title}**, one accelerator per {settings['cores_per_accelerator']} cores "
                  "(modelled):", ""]
        lines += table(["CPU cores", "accelerators", "frames/s", "bound by", "CPUs could feed",
                        "accelerators could take", "controller cores", "relay hops",
                        "version arrival s (favourable / unfavourable hop)",
                        "learner MB a version", "MB without relays"], rows)
        lines.append("")
    costs = result["unit_costs"]
    lines += ["Measured inputs (each from its results file): "
              + "; ".join(f"`{name}.json` ({source})" for name, source in
                          result["sources"].items()) + ". Per unit: "
              + "; ".join(f"{name}: env step {c['env_step_us']:.1f} us, actor runtime "
                          f"{c['actor_runtime_us']:.1f} us a frame, server "
                          f"{c['server_rows_per_core']:,.0f} rows/s a core, learner "
                          f"{c['learner_samples_per_accelerator']:,.0f} samples/s an "
                          f"accelerator, parameters {c['param_bytes'] / 1e6:.2f} MB"
                          for name, c in costs.items())
              + f"; controller {costs['atari']['controller_cores_per_worker'] * 1e3:.3f} "
              f"cores per 1,000 workers and {costs['atari']['controller_cores_per_host'] * 1e3:.3f}"
              f" per 1,000 hosts; a relay hop {costs['atari']['hop_s'] * 1e3:.0f} ms for 7 MB "
              f"({costs['atari']['hop_unfavourable_s'] * 1e3:.0f} ms from the unfavourable "
              "tree).", ""]
    lines += ["Check against the whole runs on one H200 host: "
              + "; ".join(f"`{c['experiment']}` with {c['actor_processes']} actor processes "
                          f"measured {c['measured_fps']:,.0f} frames/s, the model's actor bound "
                          f"{c['modelled_actor_bound_fps']:,.0f} ({c['ratio']:.2f}x)"
                          for c in result["checks"]) + ".", ""]
    lines += [f"The controller's line ({costs['atari']['controller_cores_fixed']:.3f} cores "
              "fixed, a least-squares fit in workers over the valid swarm rows, plus each host's "
              "batches at their measured cost) against each valid swarm row: " + "; ".join(
                  f"{c['workers']:,} workers on {c['hosts']} hosts measured "
                  f"{c['measured_cores']:.3f} cores, modelled {c['modelled_cores']:.3f}"
                  for c in result.get("controller_checks", [])) + ".", ""]
    srl = result["published_srl"]
    lines += [f"SRL's points: {srl['source']}; x: {srl['x']}; y: {srl['y']}.", "",
              f"*Modelled at commit {result['commit']} on {result['date']}.*"]
    return lines
