"""`python -m bench.report [--check]`: rewrite the generated blocks of the target file, or
check that they are what the results files give (the package's docstring says more)."""

from __future__ import annotations

import argparse
import sys

from bench.report.experiments import stale_configs
from bench.report.readme import TARGET, generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report",
        description="The README's performance, experiments, sweep and accelerator tables, "
                    "generated from the results files in bench/results/.")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {TARGET.name} is not what the results files give")
    args = parser.parse_args(argv)
    current = TARGET.read_text()
    wanted = generated(current)
    if args.check:
        problems = stale_configs()
        if wanted != current:
            problems.append(f"{TARGET.name}'s generated tables are out of date: run "
                            "python -m bench.report")
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    TARGET.write_text(wanted)
    print(f"wrote the performance and experiments tables of {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
