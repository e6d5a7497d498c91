"""`python -m bench.overhead`: the runtime's CPU per inference request and per sample
(the package's docstring says how)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from bench.harness.launcher import BenchError, raise_on_sigterm
from bench.harness.machine import describe, git_commit
from bench.overhead.measure import measure_overheads
from bench.overhead.summary import headline, print_actors, print_headline, print_overheads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead",
        description="The runtime's CPU per inference request and per sample, over real "
                    "sockets, without policy compute or updates.")
    parser.add_argument("--envs", type=int, default=16,
                        help="rows per request and columns per chunk (default: 16)")
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="seconds of each measurement (default: 1.5)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the headline and every figure to PATH as JSON")
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
    print_actors(overheads["actors"])
    print()
    head = headline(overheads)
    print_headline(head, args.envs)
    if args.json is not None:
        document = {"benchmark": "overhead", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "commit": git_commit(), "machine": describe(), **head,
                    "settings": {"envs": args.envs, "seconds": args.seconds},
                    "overheads": overheads}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
