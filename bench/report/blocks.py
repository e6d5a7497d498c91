"""Blocks made from one results file each: the learning-rate sweep, the CNN update beside
torch, the accelerator check and the control plane at scale."""

from __future__ import annotations

from typing import Any

from bench.report.markdown import machine_note, number, table


def sweep(result: dict[str, Any]) -> list[str]:
    """`bench.sweep`'s members: each value's frames and time to the target."""
    target = result["target_return"]
    rows = [[f"{m['value']:g}", number(m["frames_to_target"], ",.0f"),
             number(m["time_to_target_s"], ".1f"), number(m["final_return"], ".1f")]
            for m in result["members"]]
    lines = [f"`{result['command']}`: {len(rows)} members sharing the machine for "
             f"{result['wall_s']:.0f} s (one run, `python -m bench.sweep`):", ""]
    lines += table([result["key"].rsplit(".", 1)[-1].replace("_", " "),
                     f"frames to {target:g}", f"time to {target:g} s", "final return"], rows)
    return [*lines, "", machine_note(result)]


def accelerator(result: dict[str, Any]) -> list[str]:
    """`bench.accelerator_check`'s runs and learner cases on one accelerator host."""
    host = result["host"]
    rows = []
    for run in result["runs"].values():
        placement = run["placement"]["workers"] if run.get("placement") else {}
        shares = ", ".join(f"{name} {place['platform']} {place['memory'] or ''}".rstrip()
                           for name, place in placement.items()
                           if not name.startswith("actor"))
        memory = ", ".join(f"{name} {mib:,.0f}"
                           for name, mib in sorted(run["driver_memory_peak_mib"].items()))
        rows.append([f"`{run['experiment']}` {' '.join(run.get('overrides', []))}".rstrip(),
                     f"{run['seconds']:g} s, {run['learner_steps']:,} updates", shares,
                     number(run["fps_median"], ",.0f"),
                     number(run["learner_samples_per_s_median"], ",.0f"), memory or "-"])
    lines = [f"**{host['count']} x {host['name']}** ({host['memory_mib']:,} MiB each), jax "
             f"{result['jax']}, at commit {result['commit']}, one run each "
             "(`python -m bench.accelerator_check`):", ""]
    lines += table(["run", "length", "placement (memory share)", "env frames/s",
                     "learner samples/s", "device memory, driver peak MiB"], rows)
    cases = [f"{c['case']} {c['samples_per_s']:,.0f} samples/s (T={c['T']}, B={c['B']}, "
             f"{c['epochs']} epoch(s) x {c['minibatches']} minibatches)"
             for c in result["learner"] if "samples_per_s" in c]
    lines += ["", f"`python -m bench.learner` on one {host['name']}: {'; '.join(cases)}.", "",
              machine_note(result)]
    return lines


def learner_cnn(result: dict[str, Any]) -> list[str]:
    """`bench.learner --levers`: the CNN update with each convolution, beside torch."""
    first, reference = result["levers"][0], result["torch"]
    rows = [[f"srl_jax, `network.conv: {r['conv']}`", f"{r['samples_per_s']:,.0f}",
             f"{r['torch_ratio']:.2f}", f"{r['compile_s']:.1f}"] for r in result["levers"]]
    rows.append([f"torch {reference['torch']}, {reference['threads']} threads",
                 f"{reference['samples_per_s']:,.0f}", "1.00", "-"])
    minibatch = first["T"] * first["B"] // first["minibatches"]
    lines = [f"Nature-CNN PPO update on {first['obs']} frames, {first['epochs']} epoch(s) x "
             f"{first['minibatches']} minibatches of {minibatch}, one {first['platform']} "
             f"device, median of {first['repeats']} repeats (`{result['command']}`, commit "
             f"{result.get('commit', 'unknown')}):", ""]
    lines += table(["learner", "samples/s", "ratio to torch", "compile s"], rows)
    return [*lines, "", machine_note(result)]


def swarm(result: dict[str, Any]) -> list[str]:
    """`bench.swarm`'s rows, one per worker count: the controller's cost and its view, the
    churn's toll, and whether the simulator kept time (rows from before it measured
    itself show `-` where they lack a figure)."""
    rows = []
    for r in sorted(result["rows"].values(), key=lambda r: r["workers"]):
        churn = r.get("churn") or {}
        rows.append([
            f"{r['workers']:,}", f"{r['hosts']:,}", r["simulate"],
            "yes" if r.get("curve") else "no",
            "-" if "valid" not in r else "yes" if r["valid"] else "**no**",
            f"{r['controller_cpu_cores']:.2f}", number(r.get("controller_us_per_heartbeat"), ".0f"),
            f"{r['heartbeat_age_p50_s']:.2f}", f"{r['heartbeat_age_p99_s']:.2f}",
            f"{r['missed_heartbeats']:,}", number(r.get("lookup_p99_ms"), ".1f"),
            f"{churn['per_minute']:g}" if churn else "-",
            f"{churn['workers_killed']}" if churn else "-",
            number(churn.get("back_to_running_p99_s"), ".1f"),
            number(r.get("false_kills"), "d"),
            number(100 * r["simulator_late_fraction"], ".2f")
            if r.get("simulator_late_fraction") is not None else "-",
            f"{r['simulator_cpu_cores']:.2f}", f"{r['startup_s']:.0f}", r["commit"]])
    seconds = sorted({f"{r['seconds']:g}" for r in result["rows"].values()})
    periods = sorted({f"{r['heartbeat_period_s']:g}" for r in result["rows"].values()})
    lines = [f"Simulated workers against the real controller, measured for {'/'.join(seconds)} s "
             "once every worker runs (`python -m bench.swarm`; a heartbeat every "
             f"`runtime.stats_interval_s`, {'/'.join(periods)} s), one run each. `agents`: "
             "heartbeats handed to the host agent in their process (`--simulate agents`, the "
             "default); "
             "`workers`: each simulated worker on a socket of its own to its host's agent (the "
             "controller receives the same). A row is valid where the simulator sent at most 1% "
             "of its beats more than a period late:", ""]
    lines += table(["workers", "hosts", "heartbeats sent by", "CURVE", "valid",
                    "controller cores", "us a heartbeat", "heartbeat age p50 s", "p99 s",
                    "late (> 3 periods)", "lookup p99 ms", "churn a minute", "killed",
                    "back p99 s", "false kills", "simulator late %", "simulator cores",
                    "start-up s", "commit"], rows)
    return [*lines, "", machine_note(result)]


def param_fanout(result: dict[str, Any]) -> list[str]:
    """`bench.param_fanout`'s rows: the learner's bytes per version, with relays and without."""
    rows = [[f"{r['subscribers']:,}", f"{r['hosts']:,}",
             f"fan-out {r['fanout']}" if r["relays"] else "none (every subscriber on the learner)",
             f"{r['param_bytes'] / 1e6:.1f}", f"{r['learner_peers_max']}",
             f"{r['learner_bytes_per_version'] / 1e6:,.0f}",
             "yes" if r["subscribers_received_all"] else "**no**",
             f"{r['versions_received_fraction']:.2f}", f"{r['arrival_p50_s']:.3f}",
             f"{r['arrival_p99_s']:.3f}", r["commit"]]
            for r in sorted(result["rows"].values(),
                            key=lambda r: (r["subscribers"], r["relays"]))]
    lines = ["A version every second for 12 s, to subscribers spread over simulated hosts, each "
             "host with a real host agent in a process of its own (`python -m "
             "bench.param_fanout`), one run each:", ""]
    lines += table(["subscribers", "hosts", "relays", "MB a version", "learner's peers",
                    "learner MB a version", "all on the newest", "versions received",
                    "arrival p50 s", "p99 s", "commit"], rows)
    return [*lines, "", machine_note(result)]
