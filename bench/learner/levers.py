"""`python -m bench.learner --levers`: the CNN update with each convolution, beside the same
network, loss and minibatches in torch (`bench.peers.torch_cnn`, in Sample Factory's venv)."""

from __future__ import annotations

import argparse
import json
import subprocess
from typing import Any

from bench.harness.machine import REPO_ROOT, config_hash, write_results
from bench.learner.children import CASE_TIMEOUT_S, run_child, timing
from bench.peers.sample_factory import ensure_venv

LEVERS: tuple[tuple[str, str], ...] = (
    ("xla", "XLA's convolution (a GPU's or TPU's choice)"),
    ("matmul", "matmul convolutions (learners/models/conv.py; a CPU's choice)"),
)
"""(network.conv, what it is) of each `--levers` row."""
TORCH_SCRIPT = REPO_ROOT / "bench" / "peers" / "torch_cnn.py"
"""Run as a file by the venv's python: that venv holds torch, not srl_jax."""


def torch_reference(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | str:
    """`bench.peers.torch_cnn`'s figures for the sizes of the CNN `case` srl_jax ran, in Sample
    Factory's venv."""
    updates, repeats, _ = timing("cnn", args)
    command = [str(ensure_venv()), "-P", str(TORCH_SCRIPT), "--T", str(case["T"]),
               "--B", str(case["B"]), "--epochs", str(args.cnn_epochs),
               "--minibatches", str(args.cnn_minibatches), "--actions", str(args.cnn_actions),
               "--updates", str(updates), "--repeats", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    if done.returncode != 0:
        return f"exit code {done.returncode}: {(done.stderr.strip() or 'no output')[-300:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def levers_main(args: argparse.Namespace) -> int:
    """The CNN case on one device with each convolution, and torch's figure
    for the same network and minibatches; the table, and `bench/results/learner_cnn.json`."""
    rows = []
    for conv, what in LEVERS:
        args.conv = conv
        print(f"  {what} ...", flush=True)
        result = run_child("cnn", 1, args)
        if isinstance(result, str):
            print(f"  FAILED: {result}")
            return 1
        rows.append({"lever": what, **result})
        print(f"  {result['samples_per_s']:,.0f} samples/s, compile {result['compile_s']:.1f}s",
              flush=True)
    print("  torch, the same network and minibatches ...", flush=True)
    torch_result = torch_reference(rows[0], args)
    if isinstance(torch_result, str):
        print(f"  torch FAILED: {torch_result}")
        return 1
    reference = torch_result["samples_per_s"]
    print()
    first = rows[0]
    print(f"Nature-CNN PPO update, T={first['T']} B={first['B']}, {first['epochs']} epoch(s) x "
          f"{first['minibatches']} minibatches of {first['T'] * first['B'] // first['minibatches']}"
          f" frames, 1 {first['platform']} device:")
    for row in rows:
        row["torch_ratio"] = row["samples_per_s"] / reference
        print(f"  {row['lever']:54s} {row['samples_per_s']:7,.0f} samples/s  "
              f"x{row['torch_ratio']:.2f} of torch  (compile {row['compile_s']:.1f}s)")
    label = f"torch {torch_result['torch']}, {torch_result['threads']} threads"
    print(f"  {label:54s} {reference:7,.0f} samples/s")
    if args.quick:  # a smoke run's figures are not the results
        return 0
    path = write_results("learner_cnn", {
        "command": "python -m bench.learner --levers", "levers": rows, "torch": torch_result,
        "experiment": args.experiment.name, "config_sha256": config_hash(args.experiment)})
    print(f"wrote {path}")
    return 0
