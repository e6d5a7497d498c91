"""Each case of the learner benchmark in a fresh process (`python -m bench.learner --case`),
whose forced host devices must be set before JAX is imported."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from bench.harness.machine import REPO_ROOT
from bench.learner.case import RESULT_PREFIX

CASE_TIMEOUT_S = 3600.0
TIMING_DEFAULTS: dict[tuple[str, bool], tuple[int, int, int]] = {
    ("mlp", False): (50, 3, 2), ("mlp", True): (10, 2, 1),
    ("cnn", False): (2, 2, 1), ("cnn", True): (1, 1, 0),
}
"""(case, --quick) -> (updates per repeat, repeats, warm-up updates) unless given."""


def child_env(devices: int, platform_name: str | None) -> dict[str, str]:
    """The environment of a case's subprocess: forced host devices when more than one."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
        platform_name = platform_name or "cpu"
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    if platform_name:
        env["JAX_PLATFORMS"] = platform_name
    return env


def timing(case: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """(updates per repeat, repeats, warm-up updates) of a case: the options, else defaults."""
    updates, repeats, warmup = TIMING_DEFAULTS[case, args.quick]
    return (updates if args.updates is None else args.updates,
            repeats if args.repeats is None else args.repeats,
            warmup if args.warmup is None else args.warmup)


def child_args(case: str, devices: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "bench.learner", "--case", case,
            "--devices", str(devices), "--experiment", str(args.experiment),
            *(x for flag, value in zip(("--updates", "--repeats", "--warmup"),
                                       timing(case, args), strict=True)
              for x in (flag, str(value))),
            "--pool", str(args.pool),
            "--cnn-batch-envs", str(args.cnn_batch_envs), "--cnn-epochs", str(args.cnn_epochs),
            "--cnn-minibatches", str(args.cnn_minibatches),
            "--cnn-actions", str(args.cnn_actions), "--conv", args.conv]


def run_child(case: str, devices: int, args: argparse.Namespace) -> dict[str, Any] | str:
    """A case's result from a fresh subprocess, or a one-line reason it failed."""
    process = subprocess.Popen(child_args(case, devices, args),
                               env=child_env(devices, args.platform), cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_child(process)
        return f"timed out after {CASE_TIMEOUT_S:.0f}s"
    except BaseException:  # Ctrl-C, SIGTERM (see parent_main): stop the child by its pid
        stop_child(process)
        raise
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    lines = (stderr.strip() or stdout.strip() or "no output").splitlines()
    return f"exit code {process.returncode}: {lines[-1]}"


def stop_child(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
