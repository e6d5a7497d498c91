"""Launch scripts for clusters: a Ray cluster on a Slurm job or on TPU VMs, then the run.

    python -m srl_jax.cluster slurm  EXPERIMENT --run-dir /shared/runs/x [--set k=v ...]
    python -m srl_jax.cluster tpu-vm EXPERIMENT --run-dir runs/x --tpu NAME --zone ZONE \\
        --hosts 4 --actor-vm cpu-1 [--actor-vm cpu-2 ...] --checkpoint-dir gs://bucket/x

Both print a bash script (every command it will run, complete and quoted) or,
with `--output FILE`, write it; `--submit` then hands it to `sbatch` or `bash`;
`--dry-run` prints instead which host runs each worker and what it asks. The
script starts Ray on every host, each host offering a custom resource for its
role (`srl_jax.cluster.roles`), waits until every node joined, and runs
`python -m srl_jax.launch EXPERIMENT --backend ray` with `ray.<kind>` set to ask
for those roles. Before anything is written, the launch line goes through the
launcher's own checks and every worker is placed on a host
(`srl_jax.cluster.host_plan`): a bad `--set`, a worker with no room or a launch
the launcher would refuse stops with one line (exit 2). The scripts themselves:
`srl_jax.cluster.slurm`, `srl_jax.cluster.tpu`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from srl_jax.cluster.host_plan import HostPlan, check_launch, describe
from srl_jax.cluster.slurm import slurm_script
from srl_jax.cluster.tpu import LOCK, tpu_vm_script
from srl_jax.config.loader import EXIT_CONFIG, config_dirs, load_config, resolve_experiment_path
from srl_jax.config.schema import ConfigError, ExperimentConfig

CHECKOUT = Path(__file__).resolve().parents[2]
"""Where the TPU VM script builds srl_jax's wheel from: the checkout this runs from."""
SCRIPTS = {"slurm": (slurm_script, "sbatch"), "tpu-vm": (tpu_vm_script, "bash")}
OPEN_COORDINATOR = "--allow-unauthenticated-coordinator"
OPEN_KEY = "transport.allow_unauthenticated"
HEAD_ADDRESS = "head.invalid"
"""Where the launch line's checks see the Ray head: the script fills in the real one."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m srl_jax.cluster",
                                     description=__doc__.splitlines()[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("experiment")
    common.add_argument("--run-dir", required=True,
                        help="the run directory, on the host that runs the experiment")
    common.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE")
    common.add_argument("--port", type=int, default=6379, help="Ray's head port")
    common.add_argument("--join-timeout-s", type=float, default=300.0,
                        help="how long every Ray node has to join (default: 300)")
    common.add_argument("--output", type=Path, help="write the script here (default: print)")
    common.add_argument("--submit", action="store_true",
                        help="run it (sbatch, or bash for tpu-vm); needs --output")
    common.add_argument("--dry-run", action="store_true",
                        help="print which host runs each worker and what it asks, and the "
                             "checked launch line, instead of the script")
    common.add_argument(OPEN_COORDINATOR, dest="open_coordinator", action="store_true",
                        help="with more than one learner process: let them meet through "
                             "jax.distributed's coordinator, a gRPC server WITHOUT "
                             "authentication on the first learner host's network address, "
                             "and exchange gradients over gloo (CPU) or NCCL (GPU) on every "
                             f"learner host's, unauthenticated too (sets {OPEN_KEY}); only "
                             "where no one else reaches the hosts")
    slurm = kinds.add_parser("slurm", parents=[common], help="a heterogeneous Slurm job")
    slurm.add_argument("--python", default=sys.executable,
                       help="absolute path of the interpreter with srl_jax and Ray on every "
                            "host (default: this one, %(default)s)")
    slurm.add_argument("--local-run-dir", action="store_true",
                       help="the run directory is on the first learner host's disk alone "
                            "(default: on a disk every host mounts at the same path, as a "
                            "Slurm cluster's home or scratch, so the checkpoints in it are "
                            "declared shared: checkpoint.shared)")
    slurm.add_argument("--time", default="04:00:00")
    slurm.add_argument("--partition", default="")
    slurm.add_argument("--cpus-per-host", type=int, default=8,
                       help="CPUs of each host for Ray (default: 8)")
    slurm.add_argument("--learner-hosts", type=int, default=0,
                       help="hosts for the learners, which share each host's GPUs (default "
                            "0: the fewest, at least learner.processes, whose CPUs hold the "
                            "learner hosts' workers)")
    slurm.add_argument("--actor-hosts", type=int, default=0,
                       help="default 0: the fewest whose CPUs hold the actors and evaluator")
    slurm.add_argument("--inference-hosts", type=int, default=0,
                       help="0: the servers run on the learner hosts")
    slurm.add_argument("--gpus-per-learner-host", type=float, default=0.0)
    slurm.add_argument("--gpus-per-inference-host", type=float, default=0.0,
                       help="GPUs of each inference host, shared by its servers")
    slurm.add_argument("--gpus-for-inference", type=float, default=0.0,
                       help="with no inference hosts: GPUs of each learner host kept for its "
                            "servers, shared by them (default 0: the servers run on the CPU)")
    tpu = kinds.add_parser("tpu-vm", parents=[common], help="a TPU VM slice and CPU VMs")
    tpu.add_argument("--tpu", required=True, help="the TPU VM (slice) name")
    tpu.add_argument("--zone", required=True)
    tpu.add_argument("--hosts", type=int, required=True,
                     help="hosts in the slice (checked against it): one learner process each")
    tpu.add_argument("--tpu-chips-per-host", type=int, default=4,
                     help="TPU chips of each host, all the learner's (default: 4)")
    tpu.add_argument("--actor-vm", action="append", default=[],
                     help="a CPU VM for actors and inference servers (at least one)")
    tpu.add_argument("--tpu-inference", action="store_true",
                     help="run the inference servers on the TPU hosts, on their CPUs "
                          "(JAX_PLATFORMS=cpu), instead of on the CPU VMs")
    tpu.add_argument("--checkpoint-dir", required=True,
                     help="where the learners checkpoint: a bucket (gs://bucket/run) or an "
                          "absolute path on the TPU hosts")
    tpu.add_argument("--remote-dir", default="srl_jax",
                     help="srl_jax's directory on every host: its venv, Ray's log and pid "
                          "(relative: under the login directory; default: srl_jax)")
    tpu.add_argument("--host-python", default="/usr/bin/python3",
                     help="the hosts' Python 3.12+ that the venv is made from "
                          "(default: /usr/bin/python3)")
    tpu.add_argument("--no-install", dest="install", action="store_false",
                     help="the hosts have srl_jax and Ray already, at --python")
    tpu.add_argument("--python", default="",
                     help="with --no-install: absolute path of the hosts' interpreter")
    tpu.add_argument("--local-python", default=sys.executable,
                     help="the workstation's interpreter that builds the wheel "
                          "(default: this one)")
    tpu.add_argument("--detach", action="store_true",
                     help="start the run and return; `bash SCRIPT stop` ends it")
    args = parser.parse_args(argv)
    args.banner = "# Generated by: " + shlex.join(["python", "-m", "srl_jax.cluster", *argv])
    args.checkout = CHECKOUT
    if args.kind == "tpu-vm":  # one learner process per TPU host
        args.overrides += [f"learner.processes={args.hosts}",
                           f"checkpoint.dir={args.checkpoint_dir}"]
    return args


def check_layout(args: argparse.Namespace) -> None:
    """One line for a layout that cannot work, before the config is read."""
    if args.kind == "tpu-vm":
        if not args.actor_vm:
            raise ConfigError("'--actor-vm': at least one CPU VM for the actors and servers")
        if args.hosts < 1 or args.tpu_chips_per_host < 1:
            raise ConfigError("'--hosts' and '--tpu-chips-per-host' must be at least 1")
        if not args.install and not args.python.startswith("/"):
            raise ConfigError("'--no-install' needs '--python', the absolute path of the "
                              "hosts' interpreter")
        if args.install and not (args.checkout / LOCK).is_file():
            raise ConfigError(f"provisioning builds srl_jax from a checkout, but {LOCK} is "
                              f"not in {args.checkout}: run from a clone, or use "
                              "'--no-install'")
    if args.kind == "slurm":
        if args.cpus_per_host < 1 or \
                min(args.inference_hosts, args.learner_hosts, args.actor_hosts) < 0:
            raise ConfigError("'--cpus-per-host' must be at least 1, '--learner-hosts', "
                              "'--inference-hosts' and '--actor-hosts' at least 0")
        if not args.python.startswith("/"):
            raise ConfigError(f"'--python' must be an absolute path (not '{args.python}'): "
                              "batch jobs do not read your shell's PATH setup")
    if args.submit and not args.output:
        raise ConfigError("'--submit' needs '--output FILE'")
    if args.submit and args.dry_run:
        raise ConfigError("'--dry-run' writes and submits nothing: leave out '--submit'")
    if any(o.partition("=")[0].strip() == OPEN_KEY for o in args.overrides):
        raise ConfigError(f"'--set {OPEN_KEY}': a script gets it from '{OPEN_COORDINATOR}', "
                          "whose help says what it opens")


def open_coordinator(config: ExperimentConfig, args: argparse.Namespace) -> None:
    """A learner of several processes needs `transport.allow_unauthenticated` for its
    coordinator: the script gets it from `--allow-unauthenticated-coordinator` only."""
    processes = config.learner.processes
    if processes > 1 and not args.open_coordinator:
        what = "'--hosts'" if args.kind == "tpu-vm" else "'learner.processes'"
        raise ConfigError(
            f"{what} {processes}: the learner's processes meet through jax.distributed's "
            "coordinator and collectives, which have no authentication and listen on the "
            f"learner hosts' network addresses; add {OPEN_COORDINATOR} if no one else "
            "reaches the hosts, or run one learner process")
    if args.open_coordinator:
        args.overrides.append(f"{OPEN_KEY}=true")


def planned(args: argparse.Namespace) -> tuple[str, HostPlan]:
    """The script, and where its workers land; ConfigError for anything that would not
    run, before anything is written."""
    check_layout(args)
    config = load_config(resolve_experiment_path(args.experiment, config_dirs()),
                         args.overrides)
    open_coordinator(config, args)
    if args.kind == "slurm" and not (args.local_run_dir or config.checkpoint.dir
                                     or config.checkpoint.shared):
        args.overrides.append("checkpoint.shared=true")
    script, plan = SCRIPTS[args.kind][0](config, args)
    check_launch(plan, f"{HEAD_ADDRESS}:{args.port}")
    return script, plan


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        script, plan = planned(args)
    except ConfigError as error:
        print(f"srl_jax.cluster: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if args.dry_run:
        print(describe(plan, f"python -m srl_jax.cluster {args.kind} {args.experiment}"),
              end="")
        return 0
    if args.output is None:
        print(script, end="")
        return 0
    args.output.write_text(script)
    args.output.chmod(0o755)
    if args.submit:
        return subprocess.run([SCRIPTS[args.kind][1], str(args.output)]).returncode
    return 0
