"""Launch scripts for clusters: a Ray cluster on a Slurm job or on TPU VMs, then the run.

    python -m srl_jax.cluster slurm  EXPERIMENT --run-dir /shared/runs/x [--set k=v ...]
    python -m srl_jax.cluster tpu-vm EXPERIMENT --run-dir /shared/runs/x --tpu NAME \\
        --zone ZONE --hosts 4 --actor-vm cpu-1 [--actor-vm cpu-2 ...]

Both print a bash script (the dry run: every command it will run, complete and
quoted) or, with `--output FILE`, write it; `--submit` then hands it to
`sbatch` or `bash`. The script starts Ray on every host, each host offering a
custom resource for its role (`learner_host`, `inference_host`, `actor_host`),
and runs `python -m srl_jax.launch EXPERIMENT --backend ray` with `ray.<kind>`
set to ask for those roles, so Ray puts one learner process per learner host
(jax.distributed across them) and the servers and actors on theirs. The
experiment config is read here: counts and hosts agree, and a bad `--set`
stops with one line before anything is written.

Every host needs srl_jax installed (`--python`, the same path everywhere)
and the run directory on a filesystem they all see; Ray's token file
(`~/.ray/auth_token`) too, on a shared home.
"""

from __future__ import annotations

import argparse
import math
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from srl_jax.config import ConfigError, ExperimentConfig
from srl_jax.config_loader import load_config, resolve_experiment_path
from srl_jax.launch import EXIT_CONFIG, config_dirs
from srl_jax.worker_kinds import KINDS, worker_kind, worker_plan

RAY_CLI = ("-m", "ray.scripts.scripts")
"""Ray's command line through the interpreter, so no PATH is needed on the hosts."""


@dataclass(frozen=True)
class Roles:
    """How many hosts of each role, and what each offers Ray."""

    learner_hosts: int
    inference_hosts: int
    """0: the inference servers run on the learner hosts."""
    actor_hosts: int
    servers_per_host: int
    actors_per_host: int

    def offers(self, role: str) -> dict[str, int]:
        """Custom resources a host of `role` starts Ray with."""
        serving = {"inference_host": self.servers_per_host}
        return {"learner": {"learner_host": 1, **({} if self.inference_hosts else serving)},
                "inference": serving,
                "actor": {"actor_host": self.actors_per_host}}[role]


def plan_roles(config: ExperimentConfig, inference_hosts: int, actor_hosts: int) -> Roles:
    hosted = Counter(worker_kind(kind).host_role for kind, _, _ in worker_plan(config))
    servers, actors = hosted["inference"], hosted["actor"]
    return Roles(config.learner.processes, inference_hosts, actor_hosts,
                 math.ceil(servers / max(inference_hosts or config.learner.processes, 1)),
                 math.ceil(actors / actor_hosts))


def placement_overrides(gpus_per_learner: float = 0.0,
                        gpus_per_server: float = 0.0) -> list[str]:
    """`--set` values that send each kind of worker (with a `ray.<kind>` key) to hosts of
    its role."""
    gpus = {"learner": gpus_per_learner, "inference": gpus_per_server, "actor": 0.0}

    def ask(role: str) -> str:
        return ("{CPU: 1" + (f", GPU: {gpus[role]:g}" if gpus[role] else "")
                + f", {role}_host: 1}}")

    return [f"ray.{kind.name}={ask(kind.host_role)}" for kind in KINDS.values()
            if kind.ray_configured]


def launch_args(python: str, experiment: str, run_dir: str, overrides: list[str]) -> list[str]:
    """The run's command, after `--ray-address ADDRESS` is added by the script."""
    args = [python, "-m", "srl_jax.launch", experiment, "--backend", "ray", "--run-dir",
            run_dir, "--quiet"]
    for override in overrides:
        args += ["--set", override]
    return args


def ray_offer(resources: dict[str, int]) -> str:
    """`--resources=...` as one shell word."""
    return shlex.quote("--resources=" + ", ".join(
        f'"{k}": {v}' for k, v in resources.items()).join("{}"))


def slurm_script(config: ExperimentConfig, args: argparse.Namespace) -> str:
    roles = plan_roles(config, args.inference_hosts, args.actor_hosts)
    groups = [("learner", roles.learner_hosts, args.gpus_per_learner_host)]
    if roles.inference_hosts:
        groups.append(("inference", roles.inference_hosts, args.gpus_per_inference_host))
    groups.append(("actor", roles.actor_hosts, 0))
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
        "export RAY_AUTH_MODE=token",
        'mkdir -p "$run_dir"',
        "# awk reads all of it: with pipefail, head -n 1 could fail the script on SIGPIPE.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" '
        "| awk 'NR == 1')",
        'head_ip=$(srun --het-group=0 --nodes=1 --ntasks=1 --nodelist="$head_node" '
        "hostname --ip-address | awk '{print $1}')",
        'address="$head_ip:$port"',
        "",
        "# The head (Ray's control plane) on the first learner host; the batch step runs "
        "there too.",
        f'srun --het-group=0 --nodes=1 {step} --nodelist="$head_node" \\',
        f'  {ray} --head --node-ip-address="$head_ip" --port="$port" '
        f"--include-dashboard=false {ray_offer(roles.offers('learner'))} --block &",
        f'until {py} {shlex.join(RAY_CLI)} status --address="$address" >/dev/null 2>&1; '
        "do sleep 2; done",
    ]
    for g, (role, nodes, _) in enumerate(groups):
        others = nodes - 1 if g == 0 else nodes
        if others:
            exclude = ' --exclude="$head_node"' if g == 0 else ""
            lines += [f"srun --het-group={g} --nodes={others} {step}{exclude} \\",
                      f'  {ray} --address="$address" {ray_offer(roles.offers(role))} '
                      "--block &  # " + f"{role} hosts"]
    launch = launch_args(args.python, args.experiment, args.run_dir, [
        *args.overrides, *placement_overrides(args.gpus_per_learner_host,
                                              args.gpus_per_inference_host)])
    lines += ["", "# The run; the Ray steps end with the job.",
              f'{py} {shlex.join(launch[1:])} --ray-address="$address"']
    return "\n".join(["#!/bin/bash", _banner("slurm", args), *header, "", *lines, ""])


def tpu_vm_script(config: ExperimentConfig, args: argparse.Namespace) -> str:
    roles = plan_roles(config, len(args.actor_vm), len(args.actor_vm))
    offers = {"learner": roles.offers("learner"),
              "helper": {**roles.offers("inference"), **roles.offers("actor")}}
    launch = launch_args(args.python, args.experiment, args.run_dir,
                         [*args.overrides, *placement_overrides()])
    start = [args.python, *RAY_CLI, "start"]
    lines = [
        "set -euo pipefail",
        f"tpu={shlex.quote(args.tpu)}",
        f"zone={shlex.quote(args.zone)}",
        f"repo={shlex.quote(args.repo)}",
        f"port={args.port}",
        f"hosts={args.hosts}",
        f"actor_vms=({' '.join(shlex.quote(vm) for vm in args.actor_vm)})",
        "pid_file=/tmp/srl_jax_ray.pid",
        "",
        "# quoted ARGS...: the arguments as one command line for the remote shell.",
        "quoted() { local line; line=$(printf '%q ' \"$@\"); echo \"${line% }\"; }",
        'on_tpu() { gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" "$@"; }',
        'on_vm() { gcloud compute ssh "$1" --zone="$zone" "${@:2}"; }',
        "# A Ray node in the background on the remote host, its pid kept for the teardown.",
        'ray_node() { echo "cd $(quoted "$repo") && nohup env RAY_AUTH_MODE=token '
        '$(quoted "$@") > /tmp/srl_jax_ray.log 2>&1 < /dev/null & echo \\$! > $pid_file"; }',
        "stop_ray() {",
        "  local stop",
        '  stop="kill \\$(cat $pid_file) 2>/dev/null || true"',
        '  on_tpu --worker=all --command="$stop" || true',
        '  for vm in "${actor_vms[@]}"; do on_vm "$vm" --command="$stop" || true; done',
        "}",
        "trap stop_ray EXIT",
        "",
        'head_ip=$(gcloud compute tpus tpu-vm describe "$tpu" --zone="$zone" '
        "--format='value(networkEndpoints[0].ipAddress)')",
        'address="$head_ip:$port"',
        "# TPU host 0: the head and a learner; the other TPU hosts: one learner each.",
        f'on_tpu --worker=0 --command="$(ray_node {shlex.join(start)} --head '
        '--node-ip-address="$head_ip" --port="$port" --include-dashboard=false '
        f"{ray_offer(offers['learner'])} --block)\"",
        'for ((w = 1; w < hosts; w++)); do',
        f'  on_tpu --worker="$w" --command="$(ray_node {shlex.join(start)} '
        f'--address="$address" {ray_offer(offers["learner"])} --block)"',
        "done",
        "# CPU VMs: the actors and the inference servers (the learners own the TPUs).",
        'for vm in "${actor_vms[@]}"; do',
        f'  on_vm "$vm" --command="$(ray_node {shlex.join(start)} '
        f'--address="$address" {ray_offer(offers["helper"])} --block)"',
        "done",
        "",
        "# The run, on TPU host 0 (a terminal, so Ctrl-C reaches it).",
        'on_tpu --worker=0 --ssh-flag=-t --command="cd $(quoted "$repo") && '
        f'$(quoted env RAY_AUTH_MODE=token {shlex.join(launch)} --ray-address="$address")"',
    ]
    return "\n".join(["#!/bin/bash", _banner("tpu-vm", args), *lines, ""])


def _banner(kind: str, args: argparse.Namespace) -> str:
    return f"# Generated by: {shlex.join(['python', '-m', 'srl_jax.cluster', *args.argv])}"


SCRIPTS = {"slurm": (slurm_script, "sbatch"), "tpu-vm": (tpu_vm_script, "bash")}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m srl_jax.cluster",
                                     description=__doc__.splitlines()[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("experiment")
    common.add_argument("--run-dir", required=True, help="run directory every host sees")
    common.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE")
    common.add_argument("--python", default="python",
                        help="the interpreter with srl_jax on every host (default: python)")
    common.add_argument("--port", type=int, default=6379, help="Ray's head port")
    common.add_argument("--output", type=Path, help="write the script here (default: print)")
    common.add_argument("--submit", action="store_true",
                        help="run it (sbatch, or bash for tpu-vm); needs --output")
    slurm = kinds.add_parser("slurm", parents=[common], help="a heterogeneous Slurm job")
    slurm.add_argument("--time", default="04:00:00")
    slurm.add_argument("--partition", default="")
    slurm.add_argument("--cpus-per-host", type=int, default=8,
                       help="CPUs of each host for Ray (default: 8)")
    slurm.add_argument("--actor-hosts", type=int, default=1)
    slurm.add_argument("--inference-hosts", type=int, default=0,
                       help="0: the servers run on the learner hosts")
    slurm.add_argument("--gpus-per-learner-host", type=float, default=0.0)
    slurm.add_argument("--gpus-per-inference-host", type=float, default=0.0)
    tpu = kinds.add_parser("tpu-vm", parents=[common], help="a TPU VM slice and CPU VMs")
    tpu.add_argument("--tpu", required=True, help="the TPU VM (slice) name")
    tpu.add_argument("--zone", required=True)
    tpu.add_argument("--hosts", type=int, required=True,
                     help="hosts in the slice: one learner process each")
    tpu.add_argument("--actor-vm", action="append", default=[],
                     help="a CPU VM for actors and inference servers (at least one)")
    tpu.add_argument("--repo", default="srl_jax",
                     help="srl_jax's directory on the VMs, from the login directory")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.kind == "tpu-vm":  # one learner process per TPU host
        args.overrides.append(f"learner.processes={args.hosts}")
    return args


def check_layout(args: argparse.Namespace) -> None:
    if args.kind == "tpu-vm" and not args.actor_vm:
        raise ConfigError("'--actor-vm': at least one CPU VM for the actors and servers")
    if args.kind == "tpu-vm" and args.hosts < 1:
        raise ConfigError("'--hosts' must be at least 1")
    if args.kind == "slurm" and (args.actor_hosts < 1 or args.inference_hosts < 0
                                 or args.cpus_per_host < 1):
        raise ConfigError("'--actor-hosts' and '--cpus-per-host' must be at least 1, "
                          "'--inference-hosts' at least 0")
    if args.submit and not args.output:
        raise ConfigError("'--submit' needs '--output FILE'")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        check_layout(args)
        config = load_config(resolve_experiment_path(args.experiment, config_dirs()),
                             args.overrides)
    except ConfigError as error:
        print(f"srl_jax.cluster: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    make, submit = SCRIPTS[args.kind]
    script = make(config, args)
    if args.output is None:
        print(script, end="")
        return 0
    args.output.write_text(script)
    args.output.chmod(0o755)
    if args.submit:
        return subprocess.run([submit, str(args.output)]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
