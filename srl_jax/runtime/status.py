"""What a run is doing now: its workers, rates, queue depths, restarts, and who waits on what.

    python -m srl_jax.runtime.status RUN_DIR            # one table
    python -m srl_jax.runtime.status RUN_DIR --watch 2  # redrawn every 2 s until Ctrl-C
    python -m srl_jax.runtime.status RUN_DIR --stacks   # and every live worker's Python stacks

It reads `status.json` and the last row of `metrics.jsonl`, so it works on a
live run, a stuck one and a finished one alike. `--stacks` sends each worker
on this host SIGUSR1: workers answer by writing every thread's stack to their
log (faulthandler), which this prints. A stopped process (SIGSTOP) or one gone
cannot answer; that is said instead. Where workers run on other hosts (every worker of
a Ray run: its host is its node's address) and the controller runs on this one, the
controller is sent SIGUSR1 and signals every live worker through its launch backend
(Ray: the agent of the worker's node); with the network name service
(`runtime.names`) a worker's log, stacks included, streams into this run directory's
`logs/`, so the table and the logs are all on the controller's host. Without a
controller here, a worker on another host is listed with the command that asks it there.
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

from srl_jax.runtime.run_dir import STATUS, read_metrics, read_status
from srl_jax.runtime.worker_base import STACKS_SIGNAL

EXIT_USAGE = 2
STACK_WAIT_S = 1.0
"""How long workers signalled from here have to answer."""
RELAYED_WAIT_S = 5.0
"""... and those the controller signals through its backend (a Ray call to their node; with
runtime.names=network, their log's way back over the log stream)."""
STACK_POLL_S = 0.1
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


def _controller_here(status: dict[str, Any]) -> int | None:
    """The pid of the run's controller where it runs on this host (a launcher's process:
    a pid from another host's run, seen through a shared disk, may be anything here)."""
    pid = status.get("controller_pid")
    if status.get("state") != "running" or not isinstance(pid, int):
        return None
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"srl_jax" in command else None


def _ask(worker: dict[str, Any], here: str, relay: bool) -> bool:
    """Send `worker` SIGUSR1 where it runs on this host; whether it was asked (relayed
    through the controller counts)."""
    if relay:
        return True
    if worker.get("host") != here:
        return False
    try:
        os.kill(worker["pid"], STACKS_SIGNAL)
    except ProcessLookupError:
        return False
    return True


def _answers(asked: list[tuple[dict[str, Any], Path, int]], wait_s: float) -> list[str]:
    """What each asked worker wrote to its log from its offset on, once all have answered
    or `wait_s` has passed."""
    deadline, answered = time.monotonic() + wait_s, False
    texts = [""] * len(asked)
    while True:
        time.sleep(STACK_POLL_S)  # once more after all answered: the rest of their stacks
        for i, (_, log, offset) in enumerate(asked):
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(offset)
                    texts[i] = f.read().decode(errors="replace")
        if answered or time.monotonic() >= deadline:
            return texts
        answered = all(STACK_START.search(t) for t in texts)


def dump_stacks(run_dir: Path, status: dict[str, Any]) -> str:
    """Ask every live worker for its stacks; what each wrote to its log. Those on this
    host are signalled here; where some run on other hosts (a Ray run: every worker's host
    is its node's address) and the controller runs here, the controller is asked to signal
    them all through its backend. Those it cannot reach are named, with how to ask them."""
    here = socket.gethostname()
    live = [w for w in status["workers"] if w.get("pid") and w["state"] not in ("stopped",
                                                                                 "failed")]
    controller = _controller_here(status)
    relay = controller is not None and any(w.get("host") != here for w in live)
    asked, elsewhere = [], []
    for w in live:
        log = run_dir / "logs" / f"{w['name']}.log"
        offset = log.stat().st_size if log.exists() else 0
        if _ask(w, here, relay):
            asked.append((w, log, offset))
        elif w.get("host") != here:
            elsewhere.append(f"--- {w['name']} (pid {w['pid']} on {w.get('host')}) ---\n"
                             f"(on another host: run `kill -USR1 {w['pid']}` there; its stacks "
                             f"go to its log, which with runtime.names=network streams to "
                             f"{log})\n")
    if relay and controller is not None:
        os.kill(controller, STACKS_SIGNAL)
    wait_s = RELAYED_WAIT_S if relay else STACK_WAIT_S
    parts = []
    for (w, log, _), text in zip(asked, _answers(asked, wait_s) if asked else [], strict=True):
        first = STACK_START.search(text)
        stacks = text[first.start():] if first else ""
        if not stacks.strip():
            stacks = (f"(no answer within {wait_s:.0f}s: the process is stopped, e.g. by "
                      "SIGSTOP, or not a worker)\n")
            if relay:
                stacks = (f"(no answer within {wait_s:.0f}s, asked through the controller: "
                          f"the process is stopped, or its log stays on {w.get('host')} "
                          f"(runtime.names=network streams it to {log}))\n")
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
