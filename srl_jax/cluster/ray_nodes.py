"""Wait until a Ray cluster has all its nodes, or say in one line that it has not.

    python -m srl_jax.cluster.ray_nodes HEAD:PORT NODES [--timeout-s 300]

The cluster scripts run it on the head's host after starting Ray everywhere: a host
whose Ray failed to start (a wrong interpreter, no token, a port in use) stops the
script here, with the remote logs printed, instead of showing up minutes later as a
worker that Ray cannot place. Exit 0 with a line per node once NODES are alive, 1 on
the timeout.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import ray

from srl_jax.runtime.backends import BackendError
from srl_jax.runtime.ray_backend import check_reachable

POLL_S = 2.0


def alive_nodes() -> list[dict]:
    return [node for node in ray.nodes() if node.get("Alive")]


def wait_for_nodes(address: str, count: int, timeout_s: float) -> list[dict] | str:
    """The alive nodes once there are `count`; else why not, in one line."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check_reachable(address, timeout_s=POLL_S)
            break
        except BackendError as error:
            if time.monotonic() > deadline:
                return f"{error} after {timeout_s:g} s"
            time.sleep(POLL_S)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ray.exceptions.RayError) as error:
        # A wrong or missing token ends here too.
        return f"could not join the Ray cluster at {address}: {str(error).splitlines()[0]}"
    try:
        while len(nodes := alive_nodes()) < count and time.monotonic() < deadline:
            time.sleep(POLL_S)
    finally:
        ray.shutdown()
    if len(nodes) < count:
        return f"{len(nodes)} of {count} Ray nodes joined {address} in {timeout_s:g} s"
    return nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srl_jax.cluster.ray_nodes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("address", help="the head's HOST:PORT")
    parser.add_argument("nodes", type=int, help="nodes the cluster must have")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    nodes = wait_for_nodes(args.address, args.nodes, args.timeout_s)
    if isinstance(nodes, str):
        print(f"srl_jax.cluster.ray_nodes: {nodes}", file=sys.stderr)
        return 1
    for node in nodes:
        resources = {k: v for k, v in node["Resources"].items() if not k.startswith("node:")}
        print(f"ray node {node['NodeManagerAddress']}: {resources}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
