"""Entry point: `python -m srl_jax.launch EXPERIMENT [--set key=value ...]`.

Resolves the experiment config (a name in `configs/` or a YAML path), applies
overrides, imports its plugins, validates everything (the environment and the
algorithm's section included) before a worker starts (exit code 2 and one
line on a bad config, on a device placement this host cannot give, or on sockets its
open-file limit cannot hold: `Plan.sockets`), makes the run
directory and a `checkpoint.dir` on this host (exit code 2 and one line naming the path
and why where it cannot), writes the resolved config, prints the placement plan and
hands over to the controller. Exit code 0 when the run reached its stop condition;
non-zero with a one-line reason otherwise.

`--resume` continues the newest run of the experiment that has a checkpoint
(or the one given with `--run-dir`) from its newest complete checkpoint, with
the run's own resolved config plus any `--set` overrides (actor and server
counts, stop limits, ... may change; what the checkpoint's shapes depend on
may not). Checkpoints in a learner host's own directory, which this host does
not see, are known by the steps the learners reported in metrics.jsonl
(`srl_jax.runtime.run_dir.newest_steps`); the learners restore them themselves.
Checkpoints in another format than this srl_jax's are refused here where this host
sees them (exit code 2, one line), and by the learner that restores them otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from srl_jax.config.checkpoint_location import (
    checkpoint_location,
    filesystem_problem,
    is_bucket,
    seen_here,
)
from srl_jax.config.checks import check_checkpoint_hosts, check_exposure, spans_hosts
from srl_jax.config.loader import (
    EXIT_CONFIG,
    config_dirs,
    config_to_dict,
    load_config,
    resolve_experiment_path,
)
from srl_jax.config.population import check_population, sweep_overrides
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, ExperimentConfig, run_policies
from srl_jax.dataflow.plan import Carriers, Plan, make_plan
from srl_jax.runtime.backends import BackendError, LaunchBackend, LocalBackend
from srl_jax.runtime.host_devices import describe_host
from srl_jax.runtime.placement import Placement, plan_placement
from srl_jax.runtime.run_dir import (
    check_formats,
    checkpoint_steps,
    latest_resumable_run,
    newest_steps,
    trim_metrics,
)
from srl_jax.wire.transport import curve_wanted

EXIT_FAILED = 1
RUNS_ROOT = Path("runs")
"""Relative: run directories go under the current directory."""
BACKENDS = ("local", "ray")
FIXED_ON_RESUME = ("env", "network", "learner.algorithm", "learner.normalize_obs")
"""Config keys the checkpointed state depends on; a resume may not change them."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m srl_jax.launch",
        description="Run an srl_jax experiment: actors, inference servers and a learner.")
    parser.add_argument("experiment", help="config name in configs/ or a path to a YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value, e.g. actors.count=4")
    parser.add_argument("--run-dir", type=Path, help="run directory "
                        "(default: runs/<experiment>/<timestamp>)")
    parser.add_argument("--backend", default="local",
                        help=f"launch backend: {', '.join(BACKENDS)} (default: local)")
    parser.add_argument("--ray-address", help="with --backend ray: the cluster to join "
                        "(default: ray.address, else a local Ray instance)")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="train one population member per value (per combination, with "
                        "several --sweep), side by side, e.g. "
                        "learner.ppo.learning_rate=1e-4,3e-4,1e-3")
    parser.add_argument("--resume", action="store_true", help="continue an earlier run")
    parser.add_argument("--quiet", action="store_true", help="no live progress line")
    parser.add_argument("--plan", action="store_true", help="print the run's workers, the "
                        "streams between them and what carries each, and exit (starts nothing)")
    return parser.parse_args(argv)


def _get(values: dict, dotted: str) -> object:
    for part in dotted.split("."):
        values = values[part]
    return values


def prepare_resume(args: argparse.Namespace, experiment: ExperimentConfig) -> tuple:
    """The run to continue, its config with the overrides, and each policy's checkpoint
    step to resume from."""
    run_dir = args.run_dir or latest_resumable_run(RUNS_ROOT, experiment.name)
    if run_dir is None:
        raise ConfigError(f"'--resume': no run of '{experiment.name}' with a checkpoint under "
                          f"{RUNS_ROOT / experiment.name}")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"'--run-dir': {run_dir} is not an srl_jax run directory (no "
                          "config.yaml)")
    config = load_config(run_dir / "config.yaml", args.overrides)
    require_filesystem(config)
    try:
        steps = newest_steps(run_dir, config)
    except ValueError as error:
        raise ConfigError(f"'--resume': {error}") from None
    for policy in run_policies(config):
        if policy not in steps:
            whose = "" if policy == DEFAULT_POLICY else f" of policy '{policy}'"
            raise ConfigError(f"'--resume': {run_dir} holds no complete checkpoint{whose} to "
                              f"resume from (looked in {_where(run_dir, config)})")
    if config.name != experiment.name:
        raise ConfigError(f"'--run-dir': {run_dir} is a run of '{config.name}', not of "
                          f"'{experiment.name}'")
    saved, wanted = (yaml.safe_load((run_dir / "config.yaml").read_text()),
                     config_to_dict(config))
    for key in FIXED_ON_RESUME:
        if _get(saved, key) != _get(wanted, key):
            raise ConfigError(f"'{key}' cannot change on resume: the checkpoint was trained "
                              f"with {_get(saved, key)!r}")
    check_formats(run_dir, config, steps)
    return config, run_dir, steps


def _where(run_dir: Path, config: ExperimentConfig) -> str:
    """Where `newest_steps` looked for checkpoints."""
    location = checkpoint_location(run_dir, config.checkpoint.dir)
    return str(location) if seen_here(location) else \
        f"its metrics.jsonl, as {location} is not on this host"


def require_filesystem(config: ExperimentConfig) -> None:
    """The package a bucket's checkpoints need (the learner's host needs it too)."""
    if problem := filesystem_problem(config.checkpoint.dir):
        raise ConfigError(f"'checkpoint.dir': {problem}")


def check_fresh_location(run_dir: Path, config: ExperimentConfig) -> None:
    """A new run must not start from another run's checkpoints: its learners would
    restore them. Checked where this host sees the location."""
    require_filesystem(config)
    location = config.checkpoint.dir
    if location and seen_here(checkpoint_location(run_dir, location)) and \
            any(checkpoint_steps(run_dir, policy=policy, location=location)
                for policy in run_policies(config)):
        raise ConfigError(f"'checkpoint.dir': {config.checkpoint.dir} already holds checkpoints; "
                          "pick an empty location (or add --resume to continue that run)")


def prepare_run(args: argparse.Namespace) -> tuple:
    """Everything that can fail on bad input, before any process starts.

    Returns (config with its algorithm section resolved, run directory, policy ->
    checkpoint step to resume from, or None, each worker's device placement).
    """

    check_backend_args(args)
    if args.sweep and args.resume:
        raise ConfigError("'--sweep' starts a new run; '--resume' continues one as it was")
    if args.resume:
        path = resolve_experiment_path(args.experiment, config_dirs())
        config, run_dir, steps = prepare_resume(args, load_config(path))
    else:
        config = new_run_config(args)
        run_dir, steps = args.run_dir or RUNS_ROOT / config.name / time.strftime(
            "%Y%m%d-%H%M%S"), None
        with path_errors("--run-dir", run_dir):
            if run_dir.is_dir() and any(run_dir.iterdir()):
                raise ConfigError(f"'--run-dir': {run_dir} already holds files; pick an empty "
                                  "or new directory (or add --resume to continue it)")
        check_fresh_location(run_dir, config)
    config, placement = checked_for_backend(config, args, os.environ)
    return config, run_dir, steps, placement


@contextmanager
def path_errors(key: str, path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError within becomes one ConfigError line that names `key`, `path` and why
    (the error's strerror)."""
    try:
        yield
    except OSError as error:
        raise ConfigError(f"'{key}': {path}: {error.strerror or error}") from None


def make_run_dir(run_dir: Path, config: ExperimentConfig,
                 resume_steps: dict[str, int] | None) -> dict[str, Any] | None:
    """The run directory made ready for the controller, with the resolved config in it; on
    a resume, the metrics past its checkpoints moved aside and the old run's endpoints
    gone. Returns the metrics row a resume continues from. ConfigError naming the path
    and why where this process cannot make or write it."""
    with path_errors("--run-dir", run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        resume_row = None
        if resume_steps is not None:
            resume_row = trim_metrics(run_dir, resume_steps)
            shutil.rmtree(run_dir / "names", ignore_errors=True)  # the old run's endpoints
        (run_dir / "logs").mkdir(exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config),
                                                            sort_keys=False))
    return resume_row


def make_checkpoint_location(run_dir: Path, config: ExperimentConfig,
                             args: argparse.Namespace) -> None:
    """`checkpoint.dir`, where it is a path on this host and the learners and the evaluator
    that write there run here: made, and written to once, so that a location they could not
    write is refused before they start (elsewhere they find out themselves)."""
    location = checkpoint_location(run_dir, config.checkpoint.dir)
    if not config.checkpoint.dir or is_bucket(location) or \
            spans_hosts(config, args.backend, args.ray_address or ""):
        return
    with path_errors("checkpoint.dir", location):
        location.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=location).close()


def check_backend_args(args: argparse.Namespace) -> None:
    if args.backend not in BACKENDS:
        raise ConfigError(f"'--backend': unknown '{args.backend}' ({', '.join(BACKENDS)})")
    if args.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("'--backend ray' needs Ray: pip install 'srl-jax[ray]'")
    if args.ray_address and args.backend != "ray":
        raise ConfigError("'--ray-address' needs '--backend ray'")


def new_run_config(args: argparse.Namespace) -> ExperimentConfig:
    """A new run's config as its command line gives it (overrides and sweep applied)."""
    sweep = sweep_overrides(args.sweep) if args.sweep else []
    return load_config(resolve_experiment_path(args.experiment, config_dirs()),
                       [*args.overrides, *sweep])


def checked_for_backend(config: ExperimentConfig, args: argparse.Namespace,
                        environ: Mapping[str, str]) -> tuple[ExperimentConfig, Placement]:
    """`config` through the checks that need the environment's packages, the backend and
    the launcher's environment; returns it with its algorithm sections written whole, and
    each worker's device placement."""
    config = check_before_launch(config)
    check_exposure(config, args.backend, args.ray_address or "", environ)
    check_checkpoint_hosts(config, args.backend, args.ray_address or "")
    return config, plan_placement(config, describe_host(environ), args.backend)


def launch_line_checks(argv: list[str], environ: Mapping[str, str]) -> ExperimentConfig:
    """Every check a new run's command line (`argv`, after `srl_jax.launch`) gets before
    any process starts but those of its run directory, which may be on another host:
    what a cluster script runs is put through them where the script is made."""
    args = parse_args(argv)
    check_backend_args(args)
    return checked_for_backend(new_run_config(args), args, environ)[0]


def check_before_launch(config: ExperimentConfig) -> ExperimentConfig:
    """The checks `load_config` leaves out: those that need the environment packages and
    the algorithm's own; returns `config` with its algorithm sections written whole."""
    from actors.envs import check_env_id, check_policies
    from srl_jax.dataflow.algorithms import algorithm, resolve_algorithms

    check_env_id(config)
    check_policies(config)
    resolved = resolve_algorithms(config)
    check_population(resolved, algorithm(resolved.learner.algorithm).live)
    return resolved


def network_names(config: ExperimentConfig, backend: str, ray_address: str | None) -> bool:
    """Whether workers use the controller's name service and log stream (`runtime.names`):
    `auto` does where they may run on hosts that share no run directory with it, a Ray
    cluster given by address."""
    if config.runtime.names != "auto":
        return config.runtime.names == "network"
    return spans_hosts(config, backend, ray_address or "")


def make_backend(name: str, run_dir: Path, config: ExperimentConfig,
                 ray_address: str | None = None, shared_memory: bool = True) -> LaunchBackend:
    """`shared_memory`: the local backend owns its workers' (`shared_memory_plan`)."""
    if name == "local":
        return LocalBackend(run_dir, shared_memory, config.runtime.warm_parent)
    if name == "ray":
        from srl_jax.runtime.ray_backend import RayBackend  # imports ray

        return RayBackend(run_dir, config, ray_address)
    raise ValueError(f"unknown backend '{name}'")


def shared_memory_plan(config: ExperimentConfig, backend: str) -> tuple[bool, str | None]:
    """Whether the run's workers of this host share memory, and the line that says why
    not where `auto` falls back (srl_jax/dataflow/shm_budget.py); ConfigError for `on`."""
    from actors.actor_core import MAX_SENT_RETURNS
    from actors.envs import policy_spec
    from srl_jax.dataflow.shm_budget import plan_shared_memory

    return plan_shared_memory(config, backend, partial(policy_spec, config), MAX_SENT_RETURNS)


def run_plan(config: ExperimentConfig, args: argparse.Namespace, shared_memory: bool) -> Plan:
    """The run's workers and streams as this launch would carry them."""
    spans = spans_hosts(config, args.backend, args.ray_address or "")
    return make_plan(config, Carriers(
        args.backend, shared_memory, network_names(config, args.backend, args.ray_address),
        # Spanning hosts, workers bind off loopback (the address is each node's).
        curve_wanted(config.transport.curve, "" if spans else config.transport.bind_host)))


def check_open_files(plan: Plan, backend: str) -> None:
    """ConfigError where this host's hard limit of open files cannot serve the sockets of a
    process of the plan (each raises its soft limit to it). Only the local backend's:
    a cluster's hosts have limits of their own."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if backend == "local" and hard != resource.RLIM_INFINITY and \
            (problem := plan.open_files_problem(hard)) is not None:
        raise ConfigError(problem)


def main(argv: list[str] | None = None) -> int:
    launched = time.time()
    args = parse_args(argv)
    try:
        config, run_dir, resume_steps, placement = prepare_run(args)
        shared_memory, fallback = shared_memory_plan(config, args.backend)
        plan = run_plan(config, args, shared_memory)
        check_open_files(plan, args.backend)
        if args.plan:  # it makes no directory either
            print("\n".join([*plan.lines(), *placement.lines()]))
            return 0
        make_checkpoint_location(run_dir, config, args)
        resume_row = make_run_dir(run_dir, config, resume_steps)
    except ConfigError as error:
        print(f"srl_jax.launch: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    from srl_jax.runtime.controller import Controller
    from srl_jax.runtime.metrics import ProgressDisplay
    from srl_jax.runtime.worker_base import raise_open_files
    from srl_jax.wire.transport import CurveKeys

    logging.basicConfig(
        level=logging.INFO, filename=run_dir / "logs" / "controller.log",
        format="%(asctime)s controller %(levelname)s %(name)s: %(message)s")
    try:
        backend = make_backend(args.backend, run_dir, config, args.ray_address, shared_memory)
    except BackendError as error:
        print(f"srl_jax.launch: {error}", file=sys.stderr)
        return EXIT_FAILED
    raise_open_files()  # the controller holds a connection per worker
    bind_host = backend.bind_host() or config.transport.bind_host
    keys = CurveKeys.generate() if curve_wanted(config.transport.curve, bind_host) else None
    progress = ProgressDisplay(sys.stdout, enabled=not args.quiet)
    if resume_steps is None:
        print(f"srl_jax: {config.name} -> {run_dir}", flush=True)
    else:
        where = ", ".join(f"step {step}" if policy == DEFAULT_POLICY else f"{policy} {step}"
                          for policy, step in resume_steps.items())
        print(f"srl_jax: {config.name} resumes from checkpoint {where} -> {run_dir}",
              flush=True)
    print("\n".join(placement.lines()), flush=True)
    if fallback:
        print(f"srl_jax: {fallback}", flush=True)
        logging.getLogger(__name__).warning("%s", fallback)
    return Controller(config, run_dir, backend, progress, resume_row=resume_row,
                      resumed=resume_steps is not None, keys=keys, placement=placement,
                      launched=launched,
                      network_names=network_names(config, args.backend, args.ray_address)).run()


if __name__ == "__main__":
    sys.exit(main())
