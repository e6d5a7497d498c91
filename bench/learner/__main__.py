"""`python -m bench.learner`: every case on every device count, each in a fresh process,
and the table (the package's docstring says what is measured)."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bench.harness.machine import cpu_model
from bench.learner.case import CASES, CNN_OBS_SHAPE, DEFAULT_CONFIG, child_main
from bench.learner.children import run_child, timing
from bench.learner.levers import levers_main

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("case", "case", "{}"), ("dev", "devices", "{}"), ("TxB", "", ""),
    ("ep x mb", "", ""), ("samples/s", "samples_per_s", "{:,.0f}"),
    ("ms/upd", "ms_per_update", "{:.1f}"), ("put ms", "put_ms", "{:.2f}"),
    ("wait ms", "wait_ms", "{:.1f}"), ("outside", "outside", "{:.1%}"),
    ("bare ms", "bare_ms", "{:.1f}"), ("feed", "feed", "{:+.1%}"), ("cpu", "cpu", "{:.2f}"),
    ("compile s", "compile_s", "{:.1f}"),
)


def table_row(result: dict[str, Any]) -> list[str]:
    row = []
    for header, key, fmt in COLUMNS:
        if header == "TxB":
            row.append(f"{result['T']}x{result['B']}")
        elif header == "ep x mb":
            row.append(f"{result['epochs']}x{result['minibatches']}")
        else:
            row.append(fmt.format(result[key]))
    return row


def print_table(rows: list[list[str]]) -> None:
    headers = [c[0] for c in COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def summary_line(results: dict[tuple[str, int], dict[str, Any]]) -> str:
    parts = []
    for case in CASES:
        found = sorted((d, r) for (c, d), r in results.items() if c == case)
        if not found:
            continue
        text = " / ".join(f"{r['samples_per_s']:,.0f} ({d} dev)" for d, r in found)
        if len(found) > 1:
            text += f", x{found[-1][1]['samples_per_s'] / found[0][1]['samples_per_s']:.2f}"
        parts.append(f"{case} {text}")
    return "learner samples/s (median): " + " | ".join(parts)


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parent_main(args: argparse.Namespace) -> int:
    nproc = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else nproc
    load_before = os.getloadavg()
    print(f"machine: nproc {nproc} (usable {usable}), {platform.machine()}, "
          f"{cpu_model()}, python {platform.python_version()}; "
          f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    plan = "; ".join(f"{case}: {r} repeat(s) of {u} update(s) after {w} warm-up"
                     for case in args.cases for u, r, w in [timing(case, args)])
    print(f"settings: {plan}; pool of {args.pool} host batches; "
          f"mlp = {args.experiment.name}; "
          f"cnn = NatureCNN uint8{list(CNN_OBS_SHAPE)} {args.cnn_actions} actions, "
          f"B={args.cnn_batch_envs}, {args.cnn_epochs} epoch(s) x {args.cnn_minibatches} "
          f"minibatches{' (--quick)' if args.quick else ''}", flush=True)
    signal.signal(signal.SIGTERM, raise_interrupt)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    failures = 0
    for case in args.cases:
        for devices in args.devices_list:
            print(f"  {case} on {devices} device(s) ...", flush=True)
            start = time.perf_counter()
            result = run_child(case, devices, args)
            took = time.perf_counter() - start
            load = os.getloadavg()[0]
            if isinstance(result, str):
                failures += 1
                print(f"  {case} on {devices} device(s): FAILED, {result}", flush=True)
                continue
            results[case, devices] = result
            per_repeat = ", ".join(f"{x:,.0f}" for x in result["samples_per_s_all"])
            print(f"  {case} on {devices} {result['platform']} device(s) "
                  f"({result['device_kind']}, {result['params']:,} params, "
                  f"obs {result['obs']}): {took:.0f}s, samples/s per repeat [{per_repeat}], "
                  f"load {load:.2f}", flush=True)
    if results:
        print()
        print_table([table_row(r) for r in results.values()])
        print()
        print(summary_line(results))
    load_after = os.getloadavg()
    first = next(iter(results.values()), None)
    jax_text = f"jax {first['jax']}" if first else "jax ?"
    print(f"machine: nproc {nproc}, {jax_text}, jax.devices() of the 1-device case: "
          + ", ".join(sorted({f"{r['jax_devices']} x {r['platform']} ({r['device_kind']})"
                              for (_, d), r in results.items() if d == 1}) or ["n/a"])
          + f"; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from srl_jax.config.schema import CONVS

    parser = argparse.ArgumentParser(
        prog="python -m bench.learner",
        description="Learner update throughput (samples/s) for the CartPole MLP and a "
                    "Nature-CNN, on 1 and 4 devices (4: forced host CPU devices).")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: mlp 2 repeats of 10 updates; cnn 1 repeat of 1 update "
                             "with B=4 and 1 minibatch")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--devices-list", nargs="+", type=int, default=[1, 4],
                        metavar="N", help="device counts to run each case on (default 1 4)")
    parser.add_argument("--updates", type=int, default=None,
                        help="timed updates per repeat and phase (default: mlp 50, cnn 2)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats; the median is reported (default: mlp 3, cnn 2)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed updates first (default: mlp 2, cnn 1)")
    parser.add_argument("--pool", type=int, default=4,
                        help="distinct random host batches cycled through")
    parser.add_argument("--experiment", type=Path, default=DEFAULT_CONFIG,
                        help="config file of the MLP case (and base of the CNN case)")
    parser.add_argument("--cnn-batch-envs", type=int, default=None,
                        help="B of the CNN case (default 8; 4 with --quick)")
    parser.add_argument("--cnn-epochs", type=int, default=1)
    parser.add_argument("--cnn-minibatches", type=int, default=None,
                        help="default 2; 1 with --quick")
    parser.add_argument("--cnn-actions", type=int, default=6)
    parser.add_argument("--platform", default=None,
                        help="JAX_PLATFORMS for the children (cases with more than one "
                             "device default to cpu)")
    parser.add_argument("--levers", action="store_true",
                        help="the CNN case with each convolution, beside torch "
                             "on the same minibatches; writes bench/results/learner_cnn.json")
    parser.add_argument("--conv", choices=CONVS, default="auto",
                        help="network.conv of the cases")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cnn_batch_envs is None:
        args.cnn_batch_envs = 4 if args.quick else 8
    if args.cnn_minibatches is None:
        args.cnn_minibatches = 1 if args.quick else 2
    for case in CASES:
        updates, repeats, warmup = timing(case, args)
        if min(updates, repeats, args.pool) < 1 or warmup < 0:
            parser.error("--updates, --repeats and --pool must be at least 1, --warmup at least 0")
    if args.case:
        args.updates, args.repeats, args.warmup = timing(args.case, args)
    args.experiment = args.experiment.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.case:
        return child_main(args)
    try:
        return levers_main(args) if args.levers else parent_main(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
