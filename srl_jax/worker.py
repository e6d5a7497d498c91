"""Run one worker: `python -m srl_jax.worker KIND INDEX --run-dir DIR [--policy P]`.

The controller does this for you. With `SRL_JAX_NAMES=<endpoint>` in its environment (the
controller's name service, srl_jax/runtime/name_server.py; `SRL_JAX_CURVE_KEYS` too where the
run uses CURVE) a worker reads nothing from a shared run directory: its config and
every endpoint come from the controller, its output goes to the controller's
`logs/<worker>.log` (srl_jax/runtime/log_stream.py), and DIR is a scratch directory of its
own host. The worker classes' common base is srl_jax/runtime/worker_base.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import zmq

from srl_jax.config.loader import import_plugins
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, ExperimentConfig
from srl_jax.dataflow.stream_table import LOGS
from srl_jax.dataflow.worker_kinds import (
    EXIT_REFUSED,
    KINDS,
    UnknownWorkerKind,
    load_worker_class,
)
from srl_jax.runtime.log_stream import LogForwarder
from srl_jax.runtime.name_client import NetworkNameService
from srl_jax.runtime.name_server import NAMES_ENV
from srl_jax.runtime.run_dir import parse_run_config, read_run_config
from srl_jax.runtime.worker_base import EXIT_FAILED, LOOKUP_TIMEOUT_S
from srl_jax.wire.names import FileNameService, NameService, worker_name
from srl_jax.wire.transport import keys_from_env


def names_and_config(run_dir: Path, names_endpoint: str | None,
                     forwarder: LogForwarder | None) -> tuple[NameService, ExperimentConfig]:
    """The run directory's names and config; or, given the controller's name service,
    both from it, with `forwarder` sending this process's output to the controller."""
    if names_endpoint is None or forwarder is None:
        return FileNameService(run_dir / "names"), read_run_config(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # this host's scratch
    context: zmq.Context = zmq.Context.instance()
    keys = keys_from_env(os.environ)
    names = NetworkNameService(context, names_endpoint, keys)
    config = parse_run_config(names.run_config())
    forwarder.connect(context, names.lookup(LOGS.key(), LOOKUP_TIMEOUT_S), keys)
    return names, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run one worker of the dataflow",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="worker kinds (srl_jax/dataflow/worker_kinds.py):\n" + "\n".join(
            f"  {kind.name}: {kind.doc}" for kind in KINDS.values()))
    parser.add_argument("kind", help="the kind of worker to run (below)")
    parser.add_argument("index", type=int)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--policy", default=DEFAULT_POLICY,
                        help="the policy a learner or inference server serves")
    args = parser.parse_args(argv)
    name = worker_name(args.kind, args.index, args.policy)
    names_endpoint = os.environ.get(NAMES_ENV)
    forwarder = LogForwarder(name) if names_endpoint else None
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    try:
        names, config = names_and_config(args.run_dir, names_endpoint, forwarder)
        import_plugins(config)
        try:
            worker_class = load_worker_class(args.kind, config)
        except UnknownWorkerKind as error:
            parser.error(str(error))
        return worker_class(config, args.index, args.run_dir, names, args.policy).run()
    except ConfigError as error:
        logging.getLogger(name).error("%s refused the run: %s", name, error)
        return EXIT_REFUSED
    except Exception:
        logging.getLogger(name).exception("%s failed", name)
        return EXIT_FAILED
    finally:
        if forwarder is not None:
            forwarder.close()


if __name__ == "__main__":
    sys.exit(main())
