"""`python -m bench.overhead`: the runtime's CPU per inference request and per sample
(the package's docstring says how)."""

from __future__ import annotations

import argparse
import signal
import sys

from bench.harness.launcher import BenchError, raise_on_sigterm
from bench.overhead.measure import measure_overheads
from bench.overhead.summary import headline, print_headline, print_overheads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead",
        description="The runtime's CPU per inference request and per sample, over real "
                    "sockets, without policy compute or updates.")
    parser.add_argument("--envs", type=int, default=16,
                        help="rows per request and columns per chunk (default: 16)")
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="seconds of each measurement (default: 1.5)")
    args = parser.parse_args(argv)
    if args.envs < 1 or args.seconds <= 0:
        parser.error("--envs and --seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    print(f"overheads: {args.seconds:g}s per measurement ...", flush=True)
    try:
        overheads = measure_overheads(args.envs, args.seconds)
    except BenchError as error:
        print(f"not measured: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print()
    print_overheads(overheads)
    print()
    print_headline(headline(overheads), args.envs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
