"""What a run is doing now: its workers, rates, queue depths, restarts, and who waits on what.

    python -m srl_jax.runtime.status RUN_DIR            # one table
    python -m srl_jax.runtime.status RUN_DIR --watch 2  # redrawn every 2 s until Ctrl-C
    python -m srl_jax.runtime.status RUN_DIR --stacks   # and every live worker's Python stacks

It reads `status.json` and the last row of `metrics.jsonl`, so it works on a
live run, a stuck one and a finished one alike. `--stacks` sends each worker
on this host SIGUSR1: workers answer by writing every thread's stack to their
log (faulthandler), which this prints. A stopped process (SIGSTOP) or one gone
cannot answer; that is said instead. A worker on another host is listed with the
command that asks it there: with the network name service (`runtime.names`) its log,
stacks included, streams into this run directory's `logs/`, so the table and the logs
are all on the controller's host.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from srl_jax.config.run_dir import STATUS, read_metrics, read_status
from srl_jax.core.worker_base import STACKS_SIGNAL

EXIT_USAGE = 2
STACK_WAIT_S = 1.0
STACK_START = re.compile(r"^(Current thread|Thread) 0x", re.M)
"""How faulthandler starts a thread's stack."""
ROW_KEYS = (("fps", "fps", ".0f"), ("learner_steps", "updates", "d"),
            ("episode_return_mean", "return", ".1f"), ("policy_lag_mean", "lag", ".2f"),
            ("learner/queue_chunks", "learner queue", "d"), ("replay/size", "replay size", "d"),
            ("inference/batch_rows_mean", "batch rows", ".1f"),
            ("actor/time_wait_frac", "actor wait", ".2f"),
            ("system/restarts", "restarts", "d"), ("system/wire_rejected", "rejected", "d"))


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def _device(worker: dict[str, Any]) -> str:
    """Where the placement plan put the worker, and its device memory if reported:
    'gpu 0 (0.6) 112/140 MiB'."""
    if "platform" not in worker:
        return "-"
    text = " ".join([worker["platform"], ",".join(map(str, worker.get("devices", [])))]).strip()
    share = worker.get("memory_share")
    if share:
        text += f" ({share})"
    if "device_memory_mib" in worker:
        text += (f" {worker['device_memory_mib']:.0f}/"
                 f"{worker.get('device_memory_peak_mib', 0):.0f} MiB")
    return text


def render(status: dict[str, Any], row: dict[str, Any] | None, now: float) -> str:
    """The run's line, its last metrics, and one line per worker."""
    lines = [f"{status['experiment']} in {status['run_dir']}: {status['state']}"
             + (f" ({status['stop_reason']})" if status.get("stop_reason") else "")]
    if row is not None:
        figures = [f"{label} {row[key]:{fmt}}" for key, label, fmt in ROW_KEYS if key in row]
        lines.append(f"at {row['time']:.1f}s, {row['env_frames']} frames: " + ", ".join(figures))
    stalled = status.get("stalled_for")
    if status["state"] == "running" and stalled:
        lines.append(f"no new frames or learner steps for {stalled:.0f}s")
    header = ("worker", "pid", "state", "restarts", "heartbeat", "device", "waits on")
    table = [header]
    for w in status["workers"]:
        beat = None if w.get("last_heartbeat") is None else now - w["last_heartbeat"]
        waits = "-"
        if w.get("waiting_on"):
            waits = f"{w['waiting_on']} for {_age(now - w['waiting_since'])}"
        table.append((w["name"], str(w.get("pid") or "-"), w["state"], str(w["restarts"]),
                      _age(beat) + (" ago" if beat is not None else ""), _device(w), waits))
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    for r in table:
        lines.append("  ".join(c.ljust(n) for c, n in zip(r, widths, strict=False)) + "  " + r[-1])
    return "\n".join(lines)


def dump_stacks(run_dir: Path, status: dict[str, Any]) -> str:
    """Ask every live worker on this host for its stacks; what each wrote to its log.
    Those on other hosts are named, with how to ask them there."""
    here, asked, elsewhere = socket.gethostname(), [], []
    for w in status["workers"]:
        log = run_dir / "logs" / f"{w['name']}.log"
        if not w.get("pid") or w["state"] in ("stopped", "failed"):
            continue
        if w.get("host") != here:
            elsewhere.append(f"--- {w['name']} (pid {w['pid']} on {w.get('host')}) ---\n"
                             f"(on another host: run `kill -USR1 {w['pid']}` there; its stacks "
                             f"go to its log, which with runtime.names=network streams to "
                             f"{log})\n")
            continue
        try:
            offset = log.stat().st_size if log.exists() else 0
            os.kill(w["pid"], STACKS_SIGNAL)
        except ProcessLookupError:
            continue
        asked.append((w, log, offset))
    if asked:
        time.sleep(STACK_WAIT_S)
    parts = []
    for w, log, offset in asked:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        first = STACK_START.search(text)
        stacks = text[first.start():] if first else ""
        if not stacks.strip():
            stacks = (f"(no answer within {STACK_WAIT_S:.0f}s: the process is stopped, e.g. "
                      "by SIGSTOP, or not a worker)\n")
        parts.append(f"--- {w['name']} (pid {w['pid']}) ---\n{stacks.rstrip()}\n")
    return "\n".join(parts + elsewhere) or "no live worker\n"


def show(run_dir: Path, stacks: bool) -> str:
    status = read_status(run_dir)
    if status is None:
        return f"{run_dir} has no readable {STATUS} (its controller has not written it yet)"
    try:
        rows = read_metrics(run_dir)
    except ValueError:
        rows = []
    text = render(status, rows[-1] if rows else None, time.time())
    if stacks:
        text += "\n\n" + dump_stacks(run_dir, status)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<experiment>/<time>)")
    parser.add_argument("--stacks", action="store_true",
                        help="also print every live worker's Python stacks")
    parser.add_argument("--watch", type=float, metavar="SECONDS", default=0.0,
                        help="redraw every SECONDS until Ctrl-C")
    args = parser.parse_args(argv)
    if read_status(args.run_dir) is None:
        print(f"srl_jax.runtime.status: {args.run_dir} has no {STATUS} (not a run directory, or "
              "its controller has not started yet)", file=sys.stderr)
        return EXIT_USAGE
    if args.watch <= 0:
        print(show(args.run_dir, args.stacks))
        return 0
    # Ctrl-C sets a flag rather than raising: a KeyboardInterrupt that lands in a finalizer
    # is printed and dropped, and the screen would go on being redrawn.
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    while not interrupted.is_set():
        print("\x1b[2J\x1b[H" + show(args.run_dir, args.stacks), flush=True)
        interrupted.wait(args.watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
