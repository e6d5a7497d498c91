"""The Slurm batch script: a heterogeneous job (learner, inference and actor hosts), a
Ray node on each host as a job step, then the run in the batch step.

The job makes one Ray token and exports it (`RAY_AUTH_TOKEN`; srun hands the batch
step's environment to every step, and only the job's user can read a process's
environment), checks the interpreter on every host, starts the head and the other
nodes, waits until all of them joined (`srl_jax.cluster.ray_nodes`, bounded: a failed host
ends the job instead of holding its GPUs until the time limit), and runs the
experiment. The Ray steps end with the job.
"""

from __future__ import annotations

import argparse
import shlex
from collections import Counter

from srl_jax.cluster.host_plan import Host, HostPlan
from srl_jax.cluster.remote_shell import python_check
from srl_jax.cluster.roles import (
    RAY_CLI,
    fewest_hosts,
    launch_args,
    learners_per_host,
    placement_overrides,
    plan_roles,
    ray_offer,
    role_counts,
    share,
    worker_asks,
)
from srl_jax.config.schema import ConfigError, ExperimentConfig

TOKEN = "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')"
"""256 random bits in hex, as Ray's own `ray get-auth-token --generate` makes them."""


def gpu_asks(args: argparse.Namespace, learners_per_host: int, servers_per_host: int,
             learner_processes: int) -> dict[str, dict[str, float]]:
    """Per worker: the learners share their host's GPUs but those kept for the servers;
    each server a share of its host's (inference hosts', or those kept on a learner
    host); none asked: the placement plan runs it on the CPU (JAX_PLATFORMS=cpu)."""
    kept = 0.0 if args.inference_hosts else args.gpus_for_inference
    if not 0 <= kept <= args.gpus_per_learner_host:
        raise ConfigError(f"'--gpus-for-inference' ({kept:g}) must be between 0 and "
                          f"'--gpus-per-learner-host' ({args.gpus_per_learner_host:g})")
    learner = share(args.gpus_per_learner_host - kept, learners_per_host)
    if learner_processes > 1 and 0 < learner < 1:
        raise ConfigError(
            f"'--gpus-per-learner-host' ({args.gpus_per_learner_host:g}) gives each of the "
            f"{learners_per_host} learner processes on a host {learner:g} of a GPU, and "
            f"'learner.processes' {learner_processes}: two processes of one learner could "
            "get the same GPU, which its collectives refuse; give each a whole GPU, or add "
            "--learner-hosts")
    server_gpus = args.gpus_per_inference_host if args.inference_hosts else kept
    return {"learner": {"GPU": learner},
            "inference": {"GPU": share(server_gpus, servers_per_host)}}


def slurm_hosts(groups: list[tuple[str, int, float]], offers: dict[str, dict[str, int]],
                cpus: int) -> list[Host]:
    """Every host of the job, by het group, with what its Ray node offers."""
    return [Host(f"{role} host {i}", {"CPU": cpus, **({"GPU": gpus} if gpus else {}),
                                      **offers[role]},
                 "Ray head; the run starts here" if g == i == 0 else "")
            for g, (role, nodes, gpus) in enumerate(groups) for i in range(nodes)]


def slurm_script(config: ExperimentConfig, args: argparse.Namespace) -> tuple[str, HostPlan]:
    """The batch script, and its hosts and launch line for `srl_jax.cluster.host_plan`."""
    counts = role_counts(config)
    with_servers = counts["learner"] + (Counter() if args.inference_hosts
                                        else counts["inference"])
    learner_hosts = args.learner_hosts or fewest_hosts(with_servers, args.cpus_per_host,
                                                       config.learner.processes)
    actor_hosts = args.actor_hosts or fewest_hosts(counts["actor"], args.cpus_per_host, 1)
    roles = plan_roles(config, learner_hosts, args.inference_hosts, actor_hosts)
    asks = worker_asks(gpu_asks(args, learners_per_host(config, learner_hosts),
                                roles.servers_per_host, config.learner.processes))
    groups = [("learner", roles.hosts["learner"], args.gpus_per_learner_host)]
    if roles.hosts["inference"]:
        groups.append(("inference", roles.hosts["inference"], args.gpus_per_inference_host))
    groups.append(("actor", roles.hosts["actor"], 0))
    header = [f"#SBATCH --job-name={shlex.quote('srl_jax-' + config.name)}",
              f"#SBATCH --time={args.time}"]
    for g, (role, nodes, gpus) in enumerate(groups):
        if g:
            header.append("#SBATCH hetjob")
        header += [f"# component {g}: {role} hosts", f"#SBATCH --nodes={nodes}",
                   "#SBATCH --ntasks-per-node=1", f"#SBATCH --cpus-per-task={args.cpus_per_host}"]
        header += [f"#SBATCH --partition={args.partition}"] if args.partition else []
        header += [f"#SBATCH --gpus-per-node={gpus:g}"] if gpus else []
    py = '"$python"'
    ray = f"{py} {shlex.join(RAY_CLI)} start --num-cpus={args.cpus_per_host}"
    step = f"--ntasks-per-node=1 --cpus-per-task={args.cpus_per_host} --overlap"
    lines = [
        "set -euo pipefail",
        f"python={shlex.quote(args.python)}",
        f"run_dir={shlex.quote(args.run_dir)}",
        f"port={args.port}",
        "# One Ray token for the job; every srun step gets it through its environment.",
        f"RAY_AUTH_TOKEN={TOKEN}",
        "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN",
        'mkdir -p "$run_dir"',
        "# awk reads all of it: with pipefail, head -n 1 could fail the script on SIGPIPE.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" '
        "| awk 'NR == 1')",
        'head_ip=$(srun --het-group=0 --nodes=1 --ntasks=1 --nodelist="$head_node" '
        "hostname --ip-address | awk '{print $1}')",
        'address="$head_ip:$port"',
        "",
        "# The interpreter on every host: Python 3.12+ with srl_jax and Ray.",
    ]
    lines += [f"srun --het-group={g} --nodes={nodes} --ntasks-per-node=1 --overlap "
              f"{python_check(py, ('srl_jax', 'ray'))}"
              for g, (_, nodes, _) in enumerate(groups)]
    lines += [
        "",
        "# The head (Ray's control plane) on the first learner host; the batch step runs "
        "there too.",
        f'srun --het-group=0 --nodes=1 {step} --nodelist="$head_node" \\',
        f'  {ray} --head --node-ip-address="$head_ip" --port="$port" '
        f"--include-dashboard=false {ray_offer(roles.offers('learner'))} --block &",
    ]
    for g, (role, nodes, _) in enumerate(groups):
        others = nodes - 1 if g == 0 else nodes
        if others:
            exclude = ' --exclude="$head_node"' if g == 0 else ""
            lines += [f"srun --het-group={g} --nodes={others} {step}{exclude} \\",
                      f'  {ray} --address="$address" {ray_offer(roles.offers(role))} '
                      "--block &  # " + f"{role} hosts"]
    every = sum(nodes for _, nodes, _ in groups)
    launch = launch_args(args.python, args.experiment, args.run_dir,
                         [*args.overrides, *placement_overrides(asks)])
    lines += [
        "# Every node joined, or the job ends here (their output is in the job's log).",
        f'{py} -m srl_jax.cluster.ray_nodes "$address" {every} --timeout-s {args.join_timeout_s:g}',
        "", "# The run; the Ray steps end with the job.",
        f'{py} {shlex.join(launch[1:])} --ray-address="$address"']
    hosts = slurm_hosts(groups, {role: roles.offers(role) for role, _, _ in groups},
                        args.cpus_per_host)
    return ("\n".join(["#!/bin/bash", args.banner, *header, "", *lines, ""]),
            HostPlan(hosts, launch))
