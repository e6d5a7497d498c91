"""A scaling model with its inputs measured: the throughput and the first bottleneck of a
cluster of C CPU cores and G accelerators, for CartPole (PPO, CPU inference) and Atari
Pong (IMPALA, Nature-CNN inference on the accelerators), up to 16,000 cores.

    python -m bench.scale.model [--cores-per-accelerator 128] [--link-gbps 25]

Nothing runs here but a parameter count: it reads the per-unit costs the other
benchmarks measured (bench/results/*.json) and combines them. Measured, each from its
file: an actor core's runtime cost per env frame and an inference server core's rows
per second, runtime included (scale.json: real processes and sockets, a null env); a
learner process's intake of CartPole chunks (scale.json); one env step's cost on a core
(compare_sampling.json: CartPole, compare_pong.json: ALE Pong); the learner's update
throughput on one H200 (accelerator.json: the MLP and the Nature-CNN); the controller's
cost per worker (swarm.json, its largest valid row, less its hosts' part) and per host (a
host agent's batches: controller_heartbeats.json, per message); the parameter fan-out's copies
and arrival per hop (param_fanout.json); the networks' parameter bytes (the configs'
networks, counted here).

Modelled, and said so wherever shown: that these costs add up (no interference
between the parts), that the learner scales linearly over G accelerators, the CPU
cores split between actors and servers in the ratio that balances them, a Nature-CNN
forward pass costing a third of an update per sample (inference rows per accelerator),
a learner's intake of Atari frames bounded by its link (`--link-gbps`), one worker per
core, 64 cores per host, and the controller's cost growing linearly in workers and hosts
past the rows the swarm measured (the other swarm rows check that line: `controller_checks`).

Writes bench/results/scaling_model.json and the curve, docs/img/scaling.svg (beside
SRL's published scaling, from the paper: PUBLISHED_SRL).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.machine import CONFIGS_DIR, REPO_ROOT, git_commit, write_results
from bench.report.scaling import atari_step_us
from bench.swarm import read_results
from srl_jax.runtime.hosts.host_agent import BATCH_S

CORES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16000)
CORES_PER_HOST = 64
EXPERIMENTS = {"cartpole": "cartpole_ppo", "atari": "atari_pong_impala"}
FORWARD_SHARE = 1 / 3
"""A forward pass's share of an update's compute per sample (forward and backward)."""
FIGURE = REPO_ROOT / "docs" / "img" / "scaling.svg"
ACCELERATORS = (1, 2, 4, 8, 16, 32)
BATCHES_PER_HOST_S = 1 / BATCH_S
"""The stats_batch messages a host agent sends the controller a second."""
FANOUT_ROWS = {"favourable": "64-6.7-relays", "unfavourable": "256-6.7-relays"}
"""The param_fanout runs whose arrivals give the time per hop, both shown: 64 subscribers on
16 hosts, and 256 on 64 hosts, which on a 2-core machine measures its copying as much as the
relays (320 copies of 7 MB a second through 2 cores: p99 3.1 s, 94% of versions received)."""
PUBLISHED_SRL: dict[str, Any] = {
    "source": "github.com/reallyscalablerl/experiments, main-exp/main-result.png (January "
              "2023), Atari panel, read off the plot by eye (about +-5%)",
    "x": "GPUs (NVIDIA 3090/A100; the CPU cores per GPU are not stated with the plot)",
    "y": "frames per second, as SRL counts them",
    "atari": [(1, 15_000), (4, 57_000), (8, 88_000), (16, 176_000), (32, 325_000)],
}
"""SRL's published Atari scaling. The paper's text gives no per-scale figures that we
could read; its companion repository plots frames/s against GPUs, 1 to 32."""


@dataclass(frozen=True)
class UnitCosts:
    """The measured per-unit costs one projection combines."""

    actor_runtime_us: float
    """An actor core's runtime time per env frame, env step excluded."""
    env_step_us: float
    """One env step on one core."""
    server_rows_per_core: float
    """Observation rows an inference server core answers per second, runtime included."""
    learner_samples_per_accelerator: float
    """Samples one accelerator's update takes per second."""
    learner_intake_per_process: float
    """Samples a learner process takes off the wire per second."""
    controller_cores_fixed: float
    """The controller's cores with no worker (its loop, rows, status)."""
    controller_cores_per_worker: float
    """The controller's cores per worker, its host's part excepted."""
    controller_cores_per_host: float
    """The controller's cores per host: its agent's batches, BATCHES_PER_HOST_S a second."""
    param_bytes: int
    fanout: int
    hop_s: float
    """A version's time per hop of the relay tree (learner to relay, relay to relay or
    to a subscriber), from its arrival at the favourable measured tree's subscribers."""
    hop_unfavourable_s: float
    """The same from the unfavourable measured tree (FANOUT_ROWS)."""
    accelerator_inference: bool
    """Whether the policy runs on the accelerators (else on CPU server cores)."""

    @property
    def actor_core_frames_per_s(self) -> float:
        """Env frames one actor core makes: its env steps and the runtime's work."""
        return 1e6 / (self.env_step_us + self.actor_runtime_us)


def relay_hops(hosts: int, fanout: int) -> int:
    """Hops from the learner to a subscriber: down the relay tree of `hosts` relays, then
    from its host's relay to it."""
    return 1 + max(1, math.ceil(math.log(hosts, fanout))) if hosts > 1 else 2


def project(costs: UnitCosts, cores: int, accelerators: int) -> dict[str, Any]:
    """Frames/s of a cluster of `cores` CPU cores and `accelerators` accelerators, each
    part's bound, and which binds first."""
    workers = cores
    hosts = math.ceil(cores / CORES_PER_HOST)
    controller = controller_cores(costs, workers, hosts)
    usable = cores - min(controller, 1.0)
    actor_core = costs.actor_core_frames_per_s
    server_core = costs.server_rows_per_core
    # Each frame is one observation row: the cores that balance actors and servers.
    cpu = usable * actor_core * server_core / (actor_core + server_core)
    learner = min(costs.learner_samples_per_accelerator, costs.learner_intake_per_process)
    if costs.accelerator_inference:
        forward = costs.learner_samples_per_accelerator / FORWARD_SHARE
        accelerator = accelerators / (1 / forward + 1 / learner)
    else:
        accelerator = accelerators * learner
    bounds = {"actor and server CPUs": cpu, "learner accelerators": accelerator}
    if controller > 1.0:  # past one core the controller's turn falls behind
        bounds["controller"] = cpu * 1.0 / controller
    binding = min(bounds, key=bounds.get)
    if binding == "learner accelerators" and learner == costs.learner_intake_per_process:
        binding = "learner intake"
    hops = relay_hops(hosts, costs.fanout)
    return {"cores": cores, "accelerators": accelerators, "fps": bounds[binding],
            "bound_by": binding, "bounds": bounds, "controller_cores": controller,
            "hosts": hosts, "relay_hops": hops, "version_arrival_s": hops * costs.hop_s,
            "version_arrival_unfavourable_s": hops * costs.hop_unfavourable_s,
            "learner_link_bytes_per_version": min(costs.fanout, hosts) * costs.param_bytes,
            "unrelayed_bytes_per_version": subscribers(costs, cores) * costs.param_bytes}


def controller_cores(costs: UnitCosts, workers: int, hosts: int) -> float:
    """The controller's cores for `workers` workers on `hosts` hosts: linear in each."""
    return costs.controller_cores_fixed + workers * costs.controller_cores_per_worker \
        + hosts * costs.controller_cores_per_host


def controller_costs(swarm: dict[str, Any], heartbeats: dict[str, Any]
                     ) -> tuple[float, float, float, dict[str, Any]]:
    """(fixed cores, cores per worker, cores per host, the largest valid swarm row): a host's
    part is its agent's batches at the measured cost of a message; the rest of each valid
    row's controller cores is a line in its workers, fitted by least squares (one row: through
    zero)."""
    valid = [row for row in swarm["rows"].values() if row.get("valid", True)]
    if not valid:
        raise SystemExit("bench.scale.model: bench/results/swarm.json has no valid row")
    per_host = BATCHES_PER_HOST_S * heartbeats["rows"]["messages"]["us_per_message"] / 1e6
    workers = [row["workers"] for row in valid]
    rest = [row["controller_cpu_cores"] - row["hosts"] * per_host for row in valid]
    if len(valid) > 1:
        per_worker, fixed = (float(v) for v in np.polyfit(workers, rest, 1))
    else:
        per_worker, fixed = rest[0] / workers[0], 0.0
    return fixed, per_worker, per_host, max(valid, key=lambda row: row["workers"])


def controller_checks(costs: UnitCosts, swarm: dict[str, Any]) -> list[dict[str, Any]]:
    """The fitted line against every valid swarm row."""
    return [{"workers": row["workers"], "hosts": row["hosts"],
             "measured_cores": row["controller_cpu_cores"],
             "modelled_cores": controller_cores(costs, row["workers"], row["hosts"])}
            for row in sorted(swarm["rows"].values(), key=lambda row: row["workers"])
            if row.get("valid", True)]


def subscribers(costs: UnitCosts, cores: int) -> int:
    """Parameter subscribers without relays: inference servers (one per server core, or
    one per accelerator host's share), at least one."""
    if costs.accelerator_inference:
        return max(1, math.ceil(cores / CORES_PER_HOST))
    actor_core = costs.actor_core_frames_per_s
    return max(1, round(cores * actor_core / (actor_core + costs.server_rows_per_core)))


def param_bytes(experiment: str) -> int:
    """The bytes of an experiment's policy parameters, from its network (shapes only)."""
    import jax
    import numpy as np

    from actors.envs import policy_spec
    from learners.models.networks import init_policy_params, make_policy
    from srl_jax.config.loader import load_config

    config = load_config(CONFIGS_DIR / f"{experiment}.yaml")
    spec = policy_spec(config)
    network = make_policy(config, spec)[1]
    shapes = jax.eval_shape(lambda: init_policy_params(network, spec.obs_shape, 0))
    return int(sum(np.prod(leaf.shape) * leaf.dtype.itemsize
                   for leaf in jax.tree_util.tree_leaves(shapes)))


def unit_costs(link_gbps: float) -> tuple[dict[str, UnitCosts], dict[str, str]]:
    """Each experiment's costs, and where each measured figure came from."""
    files = {name: read_results(name) for name in (
        "scale", "compare_sampling", "compare_pong", "accelerator", "swarm", "param_fanout",
        "controller_heartbeats")}
    missing = [name for name, result in files.items() if result is None]
    if missing:
        raise SystemExit(f"bench.scale.model: no bench/results/{', '.join(missing)}.json "
                         "yet; run those benchmarks first")
    scale, swarm, fanout = files["scale"], files["swarm"], files["param_fanout"]
    fixed, per_worker, per_host, largest = controller_costs(swarm,
                                                            files["controller_heartbeats"])
    trees = {case: fanout["rows"][row] for case, row in FANOUT_ROWS.items()}
    hops = {case: tree["arrival_p50_s"] / relay_hops(tree["hosts"], tree["fanout"])
            for case, tree in trees.items()}
    relayed = trees["favourable"]
    learner = {case["case"]: case["samples_per_s"] for case in files["accelerator"]["learner"]}
    pong_bytes = param_bytes(EXPERIMENTS["atari"])
    frame_bytes = 84 * 84 * 4
    shared = {"actor_runtime_us": 1e6 / scale["actor_core_frames_per_s"],
              "server_rows_per_core": scale["server_core_rows_per_s"],
              "controller_cores_fixed": fixed, "controller_cores_per_worker": per_worker,
              "controller_cores_per_host": per_host,
              "fanout": relayed["fanout"], "hop_s": hops["favourable"],
              "hop_unfavourable_s": hops["unfavourable"]}
    sampling = files["compare_sampling"]
    costs = {
        "cartpole": UnitCosts(
            env_step_us=sampling["machine"]["cores"] * 1e6 / sampling["raw_env_steps_per_s"],
            learner_samples_per_accelerator=learner["mlp"],
            learner_intake_per_process=scale["learner_intake_samples_per_s"],
            param_bytes=param_bytes(EXPERIMENTS["cartpole"]), accelerator_inference=False,
            **shared),
        "atari": UnitCosts(
            env_step_us=atari_step_us(files["compare_pong"]),
            learner_samples_per_accelerator=learner["cnn"],
            learner_intake_per_process=link_gbps * 1e9 / 8 / frame_bytes,
            param_bytes=pong_bytes, accelerator_inference=True, **shared)}
    sources = {name: f"{result['date']}, commit {result.get('commit', 'not recorded')}"
               for name, result in files.items() if "rows" not in result}
    sources["swarm"] = (f"{largest['workers']:,} workers on {largest['hosts']} hosts, commit "
                        f"{largest['commit']}")
    sources["param_fanout"] = " and ".join(
        f"{tree['subscribers']} subscribers on {tree['hosts']} hosts ({case}: versions received "
        f"{tree['versions_received_fraction']:.0%}, arrival p99 {tree['arrival_p99_s']:.1f} s), "
        f"commit {tree['commit']}" for case, tree in trees.items())
    return costs, sources


def draw(curves: dict[str, list[dict[str, Any]]], per_gpu: list[dict[str, Any]],
         path: Path) -> None:
    """Left: the projected curves against CPU cores, log-log. Right: the Atari projection
    against accelerators, beside SRL's published Atari points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "srl_jax", "svg.fonttype": "none"})
    figure, (by_cores, by_gpus) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, label in (("cartpole", "CartPole PPO"), ("atari", "Atari Pong IMPALA")):
        points = curves[name]
        by_cores.plot([p["cores"] for p in points], [p["fps"] for p in points], marker="o",
                      label=f"srl_jax, {label} (modelled)")
    by_cores.set_xscale("log")
    by_cores.set_yscale("log")
    by_cores.set_xlabel("CPU cores (one accelerator per 128)")
    by_cores.set_title("Projected throughput", fontsize=10)
    by_gpus.plot([p["accelerators"] for p in per_gpu], [p["fps"] for p in per_gpu], marker="o",
                 color="C1", label="srl_jax, Atari Pong IMPALA (modelled, H200)")
    published = PUBLISHED_SRL["atari"]
    by_gpus.plot([g for g, _ in published], [f for _, f in published], marker="s",
                 linestyle="--", color="C2", label="SRL, Atari (published plot, read off)")
    by_gpus.set_xscale("log", base=2)
    by_gpus.set_yscale("log")
    by_gpus.set_xlabel("accelerators (GPUs)")
    by_gpus.set_title("Atari beside SRL's published scaling", fontsize=10)
    for axes in (by_cores, by_gpus):
        axes.set_ylabel("env frames/s")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata={"Date": None})
    plt.close(figure)


def checks(costs: dict[str, UnitCosts]) -> list[dict[str, Any]]:
    """The model's actor bound against the whole runs measured on one accelerator host
    (accelerator.json), with as many actor cores as those runs had actor processes."""
    from srl_jax.config.loader import load_config

    runs = (read_results("accelerator") or {}).get("runs", {})
    found = []
    for name, experiment in EXPERIMENTS.items():
        run = next((r for r in runs.values() if r["experiment"] == experiment
                    and not r.get("overrides")), None)
        if run is None:
            continue
        actors = load_config(CONFIGS_DIR / f"{experiment}.yaml").actors.count
        cost = costs[name]
        modelled = actors * cost.actor_core_frames_per_s
        found.append({"experiment": experiment, "actor_processes": actors,
                      "measured_fps": run["fps_median"], "modelled_actor_bound_fps": modelled,
                      "ratio": modelled / run["fps_median"]})
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores-per-accelerator", type=int, default=128)
    parser.add_argument("--link-gbps", type=float, default=25.0,
                        help="each learner's network link (bounds its intake of Atari frames)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    costs, sources = unit_costs(args.link_gbps)
    curves = {name: [project(cost, cores, max(1, cores // args.cores_per_accelerator))
                     for cores in CORES] for name, cost in costs.items()}
    per_gpu = [project(costs["atari"], gpus * args.cores_per_accelerator, gpus)
               for gpus in ACCELERATORS]
    checked = checks(costs)
    controller_checked = controller_checks(costs["cartpole"], read_results("swarm") or {})
    for name, points in curves.items():
        print(f"{name}:")
        for p in points:
            print(f"  {p['cores']:>6,} cores {p['accelerators']:>4} accelerators "
                  f"{p['fps']:>14,.0f} frames/s  bound by {p['bound_by']}")
    for check in checked:
        print(f"check: {check['experiment']} with {check['actor_processes']} actors measured "
              f"{check['measured_fps']:,.0f} frames/s, modelled actor bound "
              f"{check['modelled_actor_bound_fps']:,.0f} ({check['ratio']:.2f}x)")
    for check in controller_checked:
        print(f"check: the controller at {check['workers']:,} workers on {check['hosts']} "
              f"hosts measured {check['measured_cores']:.3f} cores, modelled "
              f"{check['modelled_cores']:.3f}")
    draw(curves, per_gpu, FIGURE)
    path = write_results("scaling_model", {
        "settings": {"cores_per_accelerator": args.cores_per_accelerator,
                     "link_gbps": args.link_gbps, "cores_per_host": CORES_PER_HOST},
        "unit_costs": {name: asdict(cost) for name, cost in costs.items()},
        "sources": sources, "curves": curves, "per_accelerator": per_gpu, "checks": checked,
        "controller_checks": controller_checked,
        "published_srl": PUBLISHED_SRL,
        "commit": git_commit()})
    print(f"written to {path} and {FIGURE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
