"""Entry point: `python -m srl_jax.launch EXPERIMENT [--set key=value ...]`.

Resolves the experiment config (a name in `configs/` or a YAML path), applies
overrides, validates everything before a worker starts (exit code 2 and one
line on a bad config), makes the run directory, writes the resolved config and
hands over to the controller. Exit code 0 when the run reached its stop
condition; non-zero with a one-line reason otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import yaml

from srl_jax.config import ConfigError, config_to_dict, load_config, resolve_experiment_path

EXIT_CONFIG = 2
REPO_ROOT = Path(__file__).resolve().parent.parent


def config_dirs() -> list[Path]:
    """Where experiment names are looked up: ./configs, then the repository's."""
    dirs = [Path.cwd() / "configs", REPO_ROOT / "configs"]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m srl_jax.launch",
        description="Run an srl_jax experiment: actors, inference servers and a learner.")
    parser.add_argument("experiment", help="config name in configs/ or a path to a YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value, e.g. actors.count=4")
    parser.add_argument("--run-dir", type=Path, help="run directory "
                        "(default: runs/<experiment>/<timestamp>)")
    parser.add_argument("--backend", default="local", help="launch backend (default: local)")
    parser.add_argument("--resume", action="store_true", help="continue an earlier run")
    parser.add_argument("--quiet", action="store_true", help="no live progress line")
    return parser.parse_args(argv)


def prepare_run(args: argparse.Namespace) -> tuple:
    """Everything that can fail on bad input, before any process starts."""
    from actors.envs import env_spec

    if args.backend != "local":
        raise ConfigError(f"'--backend': '{args.backend}' is not available; this version has "
                          "'local'")
    if args.resume:
        raise ConfigError("'--resume': resuming needs checkpoints, which this version does "
                          "not write yet")
    path = resolve_experiment_path(args.experiment, config_dirs())
    config = load_config(path, args.overrides)
    env_spec(config.env)
    run_dir = args.run_dir or Path("runs") / config.name / time.strftime("%Y%m%d-%H%M%S")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"'--run-dir': {run_dir} already holds files; pick an empty or new "
                          "directory")
    return config, run_dir


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, run_dir = prepare_run(args)
    except ConfigError as error:
        print(f"srl_jax.launch: config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    from srl_jax.backends import make_backend
    from srl_jax.controller import Controller
    from srl_jax.metrics import ProgressDisplay

    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    logging.basicConfig(
        level=logging.INFO, filename=run_dir / "logs" / "controller.log",
        format="%(asctime)s controller %(levelname)s %(name)s: %(message)s")
    backend = make_backend(args.backend, run_dir)
    progress = ProgressDisplay(sys.stdout, enabled=not args.quiet)
    print(f"srl_jax: {config.name} -> {run_dir}", flush=True)
    return Controller(config, run_dir, backend, progress).run()


if __name__ == "__main__":
    sys.exit(main())
