"""The TPU VM script: provision a slice's hosts and CPU VMs over gcloud, start Ray on
all of them, wait for every node, then run the experiment on TPU host 0.

    bash SCRIPT          # provision, start Ray, run (Ctrl-C or the end stops Ray)
    bash SCRIPT stop     # a detached run (--detach): stop it, then Ray on every host

Provisioning builds srl_jax's wheel on the workstation (the checkout's own build
backend), copies it with `requirements/cluster.lock` and a fresh Ray token to every
host, and installs both into a venv there (`<remote dir>/venv`, hashes checked),
after checking the host's Python. Remote commands come from `srl_jax.cluster.remote_shell`:
every Ray node and a detached run are started in a session of their own with their
real pid kept, and stopped by process group. TPU host w's Ray node gives its learner
JAX process id w (`SRL_JAX_PROCESS_ID`), so learner ranks follow the slice's worker
ids whatever order Ray places them in.
"""

from __future__ import annotations

import argparse
import re
import shlex

from srl_jax.cluster.host_plan import Host, HostPlan
from srl_jax.cluster.remote_shell import detached, home_path, log_tail, python_check, stop_group
from srl_jax.cluster.roles import (
    RAY_CLI,
    launch_args,
    learners_per_host,
    placement_overrides,
    plan_roles,
    ray_offer,
    worker_asks,
)
from srl_jax.config.env_families import extras_of
from srl_jax.config.schema import ConfigError, ExperimentConfig, run_policies

LOCK = "requirements/cluster.lock"
"""Pinned with hashes: srl-jax's `[cluster]` extra (`CLUSTER_EXTRAS`)."""
CLUSTER_EXTRAS = ("ray", "tpu", "gcs", "s3", "atari", "mujoco", "multiagent", "minatar",
                  "jaxmarl")
"""What the lock installs on every host besides the base: Ray, libtpu, buckets, and the
environment families that run on any host (EnvPool's wheels are x86-only)."""
SLICE_FIELDS = ("import json, sys; d = json.load(sys.stdin); e = d.get('networkEndpoints') "
                "or [{}]; print(d.get('acceleratorType', '?'), len(d.get('networkEndpoints') "
                "or []), e[0].get('ipAddress', '-'))")
"""`gcloud ... describe --format=json` to 'ACCELERATOR_TYPE HOSTS HOST_0_IP'."""
LOCAL_VARIABLES = ("address", "head_ip", "w")
"""The workstation's variables a remote line may name as ${...}: set there at run time."""
RUN_GRACE_S = 180
"""How long `stop` gives the run to stop its workers (the learner saves last)."""


def local_word(remote: str) -> str:
    """`remote` as one double-quoted word of the workstation's script: literal, but for
    the workstation's own ${address}, ${head_ip} and ${w}, filled in there."""
    escaped = re.sub(r'([\\"`$])', r"\\\1", remote)
    for name in LOCAL_VARIABLES:
        escaped = escaped.replace(f"\\${{{name}}}", f"${{{name}}}")
    return f'"{escaped}"'


class Remote:
    """Paths and command lines on the hosts, under `--remote-dir`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dir = args.remote_dir.rstrip("/")
        self.python = (shlex.quote(args.python) if args.python
                       else self.path("venv/bin/python"))
        self.ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.path("ray_token")}

    def path(self, name: str) -> str:
        return home_path(f"{self.dir}/{name}")

    @property
    def wheels(self) -> str:
        """srl_jax's wheels in the remote directory (the glob left unquoted)."""
        return self.path("") + "srl_jax-*.whl"

    def prepare(self, host_python: str | None) -> str:
        """Check the interpreter a venv will be made from; make the directory."""
        check = python_check(shlex.quote(host_python), ("venv", "ensurepip")) + " && " \
            if host_python else ""
        return f"{check}mkdir -p {self.path('')} && rm -f {self.wheels}"

    def install(self, host_python: str) -> str:
        """A venv at an absolute path, the lock's pins (hashes checked), then the wheel."""
        venv, pip = self.path("venv"), f"{self.python} -m pip install -q"
        return (f"set -e; [ -x {self.python} ] || {shlex.quote(host_python)} -m venv {venv}; "
                f"{pip} --require-hashes -r {self.path('cluster.lock')}; "
                f"{pip} --no-deps --force-reinstall {self.wheels}; "
                f"chmod 600 {self.path('ray_token')}; "
                f"{python_check(self.python, ('srl_jax', 'ray'))}")

    def ray_node(self, start: list[str], env: dict[str, str] | None = None) -> str:
        argv = [self.python, *map(shlex.quote, [*RAY_CLI, "start"]), *start, "--block"]
        return detached(argv, self.path("ray.log"), self.path("ray.pid"),
                        {**self.ray_env, **(env or {})})


def check_slice_fit(config: ExperimentConfig, hosts: int) -> None:
    """Refuse, before anything is provisioned, a config a slice cannot run: several
    learners (a slice's hosts run one, a process each, on all their chips), or an
    environment whose packages the hosts do not get."""
    if learners_per_host(config, hosts) > 1:
        trained = run_policies(config)
        raise ConfigError(
            f"{config.name} trains {len(trained)} learners ({', '.join(trained)}), and a "
            "TPU slice runs one (a process on each host, on all its chips): run it on GPU "
            "or CPU hosts (python -m srl_jax.cluster slurm, or a Ray cluster)")
    missing = [extra for extra in extras_of(config.env) if extra not in CLUSTER_EXTRAS]
    if missing:
        raise ConfigError(f"'env': {config.env.id} needs srl-jax[{','.join(missing)}], which "
                          f"the TPU VM hosts do not get ({LOCK} installs "
                          f"[{','.join(CLUSTER_EXTRAS)}])")


def tpu_vm_script(config: ExperimentConfig, args: argparse.Namespace) -> tuple[str, HostPlan]:
    """The script, and its hosts and launch line for `srl_jax.cluster.host_plan`."""
    check_slice_fit(config, args.hosts)
    vms = len(args.actor_vm)
    roles = plan_roles(config, args.hosts, 0 if args.tpu_inference else vms, vms)
    tpu_offer = roles.offers("learner")
    vm_offer = {**roles.offers("actor"),
                **({} if args.tpu_inference else roles.offers("inference"))}
    remote = Remote(args)
    launch = launch_args(remote.python, args.experiment, args.run_dir, [
        *args.overrides,
        *placement_overrides(worker_asks({"learner": {"TPU": args.tpu_chips_per_host}}))])
    launch_line = (" ".join([launch[0], *map(shlex.quote, launch[1:])])
                   + " --ray-address=${address}")
    run_env = " ".join(f"{k}={v}" for k, v in remote.ray_env.items())
    foreground = f"env {run_env} {launch_line}"
    head = remote.ray_node(["--head", "--node-ip-address=${head_ip}", f"--port={args.port}",
                            "--include-dashboard=false", ray_offer(tpu_offer)],
                           {"SRL_JAX_PROCESS_ID": "0"})
    tpu_worker = remote.ray_node(["--address=${address}", ray_offer(tpu_offer)],
                                 {"SRL_JAX_PROCESS_ID": "${w}"})
    helper = remote.ray_node(["--address=${address}", ray_offer(vm_offer)])
    wait = (f"{run_env} {remote.python} "
            f"-m srl_jax.cluster.ray_nodes ${{address}} {args.hosts + vms} "
            f"--timeout-s {args.join_timeout_s:g}")
    stop_ray = stop_group(remote.path("ray.pid"))
    stop_run = stop_group(remote.path("run.pid"), RUN_GRACE_S)
    tail = log_tail(remote.path("ray.log"))

    lines = [
        "# Usage: bash THIS_SCRIPT [start|stop]",
        "set -euo pipefail",
        f"tpu={shlex.quote(args.tpu)}",
        f"zone={shlex.quote(args.zone)}",
        f"hosts={args.hosts}",
        f"actor_vms=({' '.join(shlex.quote(vm) for vm in args.actor_vm)})",
        f"local_python={shlex.quote(args.local_python)}",
        'action="${1:-start}"',
        "",
        'on_tpu() { gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" "$@"; }',
        'on_vm() { gcloud compute ssh "$1" --zone="$zone" "${@:2}"; }',
        "# each_host COMMAND: on every TPU host, then on every CPU VM.",
        "each_host() {",
        '  on_tpu --worker=all --command="$1"',
        '  for vm in "${actor_vms[@]}"; do on_vm "$vm" --command="$1"; done',
        "}",
        "# copy_to_hosts FILE...: into the remote directory of every host.",
        "copy_to_hosts() {",
        f'  gcloud compute tpus tpu-vm scp "$@" "$tpu:{args.remote_dir}/" --worker=all '
        '--zone="$zone"',
        '  for vm in "${actor_vms[@]}"; do',
        f'    gcloud compute scp "$@" "$vm:{args.remote_dir}/" --zone="$zone"',
        "  done",
        "}",
        "stop_all() {",
        f"  on_tpu --worker=0 --command={local_word(stop_run)} || true",
        f"  each_host {local_word(stop_ray)} || true",
        "}",
        'if [ "$action" = stop ]; then stop_all; exit 0; fi',
        'if [ "$action" != start ]; then echo "usage: bash $0 [start|stop]" >&2; exit 2; fi',
        "",
        "# The slice: its accelerator type and hosts, host 0's address for the head.",
        'slice=$(gcloud compute tpus tpu-vm describe "$tpu" --zone="$zone" --format=json '
        f'| "$local_python" -c {shlex.quote(SLICE_FIELDS)})',
        'read -r accelerator workers head_ip <<< "$slice"',
        'if [ "$workers" != "$hosts" ]; then',
        '  echo "srl_jax: --hosts is $hosts, but TPU $tpu ($accelerator) has $workers hosts" '
        ">&2",
        "  exit 2",
        "fi",
        f'address="$head_ip:{args.port}"',
        "",
        'stage=$(mktemp -d)',
        "trap 'rm -rf \"$stage\"' EXIT",
        "# A Ray token for this run only: Ray refuses to start without one (RAY_AUTH_MODE).",
        "(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \\n' > \"$stage/ray_token\")",
    ]
    if args.install:
        checkout = shlex.quote(str(args.checkout))
        lines += [
            "# Provisioning: srl_jax's wheel and the pinned requirements on every host.",
            f'"$local_python" -m pip wheel -q --no-deps --no-build-isolation -w "$stage" '
            f"{checkout}",
            f'cp {checkout}/{LOCK} "$stage/"',
            f"each_host {local_word(remote.prepare(args.host_python))}",
            'copy_to_hosts "$stage"/*',
            f"each_host {local_word(remote.install(args.host_python))}",
        ]
    else:
        lines += [f"each_host {local_word(remote.prepare(None))}",
                  'copy_to_hosts "$stage/ray_token"',
                  f"each_host {local_word(python_check(remote.python, ('srl_jax', 'ray')))}"]
    lines += [
        "",
        "trap 'stop_all; rm -rf \"$stage\"' EXIT",
        "# Ray: TPU host w runs learner (JAX) process w; the head is on host 0.",
        f"on_tpu --worker=0 --command={local_word(head)}",
        'for ((w = 1; w < hosts; w++)); do',
        f'  on_tpu --worker="$w" --command={local_word(tpu_worker)}',
        "done",
        "# CPU VMs: the actors" + ("" if args.tpu_inference else " and the inference servers")
        + ".",
        'for vm in "${actor_vms[@]}"; do',
        f'  on_vm "$vm" --command={local_word(helper)}',
        "done",
        f"if ! on_tpu --worker=0 --command={local_word(wait)}; then",
        "  echo 'srl_jax: Ray did not start on every host; the end of each Ray log:' >&2",
        f"  each_host {local_word(tail)} >&2 || true",
        "  exit 1",
        "fi",
        "",
    ]
    if args.detach:
        run = detached([launch_line], remote.path("run.log"), remote.path("run.pid"),
                       remote.ray_env)
        where = (f"srl_jax: running; its output is in {args.remote_dir}/run.log on TPU host 0, "
                 f"the run directory {args.run_dir} there; stop it with: bash ")
        lines += [
            "# The run, detached on TPU host 0; `bash THIS_SCRIPT stop` ends it and Ray.",
            f"on_tpu --worker=0 --command={local_word(run)}",
            "trap 'rm -rf \"$stage\"' EXIT",
            f'echo {shlex.quote(where)}"$0 stop"',
        ]
    else:
        lines += [
            "# The run, on TPU host 0 (a terminal, so Ctrl-C reaches it).",
            f"on_tpu --worker=0 --ssh-flag=-t --command={local_word(foreground)}",
        ]
    hosts = [Host(f"TPU host {w}", {"TPU": args.tpu_chips_per_host, **tpu_offer},
                  "Ray head; the run starts here" if w == 0 else "")
             for w in range(args.hosts)]
    hosts += [Host(f"CPU VM {vm}", dict(vm_offer)) for vm in args.actor_vm]
    return "\n".join(["#!/bin/bash", args.banner, *lines, ""]), HostPlan(hosts, launch)
