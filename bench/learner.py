"""Learner update throughput: samples per second through the compiled update.

What it measures
----------------
For each case, one (network, device count) pair, it builds the update exactly
as the learner worker does (`learners/workers/learner_worker.py`): the algorithm's
optimizer and `make_update`, `make_learner_mesh(devices, B)`, the train state
put replicated on the mesh, `compile_update` on an example batch shaped by
`chunk_layout`, and batches turned into the update's input by `to_batch` and
`put_batch`. It then feeds it random host batches the way the learner does:
the update is dispatched, the *next* batch is put onto the mesh while it runs
(prefetch), then the metrics are fetched, which waits for the update.

Cases:

- ``mlp``: the default experiment (``configs/cartpole_ppo.yaml``): the
  actor-critic MLP from `learners/models/networks.py`, obs float32 [4], 2 discrete
  actions, PPO with its settings (T=32, B=32, 4 epochs x 4 minibatches).
- ``cnn``: the learner's Nature-CNN (Mnih et al. 2015; `network.kind: nature_cnn`)
  on 84x84x4 uint8 frames with 6 discrete actions, through the same PPO
  update. Its batch and epochs default smaller (T=32, B=8, 1 epoch x 2
  minibatches of 128) so that the four cases finish in minutes on 2 CPU
  cores; the table says what was used.

With ``network.conv: xla`` the CNN update is slow on XLA:CPU: PPO's update runs
its gradient steps inside `lax.scan` (epochs, minibatches), XLA:CPU's
`ConvCanonicalization` pass only visits the entry computation, so the backward
convolutions in those loop bodies run on the naive loop emitter, and even
unrolled, the 3x3 layer's gradients take most of the update. ``auto`` therefore
computes the convolutions as matmuls on a CPU (`learners/models/conv.py`).

``--levers`` runs the CNN case on one device with each ``network.conv`` and,
in Sample Factory's venv (`bench/sample_factory_peer.py`), the same network,
PPO loss and minibatches in torch (`bench/torch_cnn.py`), and prints each
figure as a ratio to torch's; it writes ``bench/results/learner_cnn.json``,
from which `bench/report.py` makes the README's table.

Each runs on 1 device and on 4 devices. The 4-device case uses forced host CPU
devices (``--xla_force_host_platform_device_count``), which must be set before
JAX is imported, so the parent runs every case in a fresh subprocess of this
script (``--case NAME --devices N``) and collects the one JSON line each child
prints. On a machine with 2 cores, 4 forced devices share the same 2 cores: the
figure shows the cost of the sharded program (collectives, the all-gather of
the shuffle) rather than a speed-up.

Per case, after ``--warmup`` updates, ``--repeats`` times:

1. **pipelined**: ``--updates`` updates fed as above, each with a new host
   batch (to_batch + put_batch included). ``samples/s`` is ``T*B`` / (wall time
   per update); ``ms/upd`` is the wall time per update. Per update the time is
   split into ``put`` (to_batch + put_batch of the next batch, on the learner's
   thread), ``dispatch`` and ``wait`` (blocked until the metrics are back):
   ``outside = 1 - (dispatch + wait) / total`` is the share of wall time the
   loop spends outside the compiled update, i.e. putting batches.
2. **bare**: the same number of updates on one batch already on the mesh, no
   puts: the compiled update alone. ``feed = 1 - bare / pipelined`` is what
   feeding new batches costs in throughput (it can be ~0 when the put fully
   overlaps the update, and on a small CPU machine the put and the update
   compete for the same cores).

Figures are medians over the repeats. ``cpu`` is the child's CPU time over its
wall time in the timed loops (2.0 = both cores of a 2-core machine busy): far
below nproc while the machine's load average is high means other processes
took cores and the figures are low.

Why
---
The learner must keep up with the actors: with samples/s of the update known,
``actors * envs`` frames per second that one learner can consume follows, and
``outside`` / ``feed`` tell whether the host->device feed or the update itself
is the limit. The 1- vs 4-device figures check that the data-parallel mesh
path costs little when it cannot gain (on CPU) and show its scaling where it
can (on real devices).

Run from the repository root::

    .venv/bin/python bench/learner.py            # all 4 cases
    .venv/bin/python bench/learner.py --quick    # smoke run, a few seconds a case
    .venv/bin/python bench/learner.py --cases cnn --devices 1 --cnn-batch-envs 8
    .venv/bin/python bench/learner.py --levers   # CNN: XLA's vs matmul convs vs torch
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from srl_jax.config.schema import ExperimentConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_EXPERIMENT = REPO_ROOT / "configs" / "cartpole_ppo.yaml"
CASES = ("mlp", "cnn")
CNN_OBS_SHAPE = (84, 84, 4)
RESULT_PREFIX = "BENCH_RESULT "
"""A child's result line on stdout: this prefix, then one JSON object."""
CASE_TIMEOUT_S = 3600.0
TIMING_DEFAULTS: dict[tuple[str, bool], tuple[int, int, int]] = {
    ("mlp", False): (50, 3, 2), ("mlp", True): (10, 2, 1),
    ("cnn", False): (2, 2, 1), ("cnn", True): (1, 1, 0),
}
"""(case, --quick) -> (updates per repeat, repeats, warm-up updates) unless given."""


# --------------------------------------------------------------------------- one case


def case_config(case: str, args: argparse.Namespace) -> ExperimentConfig:
    """The default experiment's config, with the CNN case's smaller batch and epochs."""
    from srl_jax.config.loader import load_config
    from srl_jax.config.schema import ActorConfig, request_rows

    overrides: list[str] = []
    if case == "cnn":
        B = args.cnn_batch_envs
        # One chunk per actor split of B envs, so the config validates with any B.
        overrides += ["network.kind=nature_cnn",
                      f"learner.batch_envs={B}", f"actors.envs={B}", "actors.splits=1",
                      f"inference.max_batch={request_rows(ActorConfig(envs=B, splits=1))}",
                      f"learner.ppo.epochs={args.cnn_epochs}",
                      f"learner.ppo.minibatches={args.cnn_minibatches}"]
    overrides.append(f"network.conv={args.conv}")
    return load_config(args.experiment, overrides)


def case_policy(case: str, config: ExperimentConfig, args: argparse.Namespace) -> tuple:
    """(env spec, policy, network) of a case: the experiment's MLP or the Nature-CNN."""
    from actors.envs import policy_spec
    from learners.models.networks import make_policy
    from srl_jax.core.env_spec import EnvSpec

    if case == "mlp":
        spec = policy_spec(config)
        return (spec, *make_policy(config, spec))
    spec = EnvSpec(CNN_OBS_SHAPE, np.dtype(np.uint8), args.cnn_actions, continuous=False)
    return (spec, *make_policy(config, spec))


def random_host_batch(layout: dict[str, tuple[tuple[int, ...], np.dtype]], B: int,
                      action_dim: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random arrays of one [T+1, B] batch as the learner's queue hands it over."""
    out: dict[str, np.ndarray] = {}
    for name, (chunk_shape, dtype) in layout.items():
        shape = (chunk_shape[0], B, *chunk_shape[2:])
        if name == "obs" and dtype == np.uint8:
            out[name] = rng.integers(0, 256, shape, dtype=np.uint8)
        elif name == "actions" and np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, action_dim, shape).astype(dtype)
        elif name == "logp":
            out[name] = (np.log(1.0 / action_dim) + 0.1 * rng.standard_normal(shape)).astype(dtype)
        elif name == "terminated":
            out[name] = rng.random(shape) < 0.02
        elif name == "truncated":
            out[name] = rng.random(shape) < 0.005
        elif name == "versions":
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def run_case(case: str, devices: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build the learner's update for `case` on `devices` devices and time it."""
    import jax

    from learners.algorithms.registry import algorithm, algorithm_config, live_values, sizes
    from learners.algorithms.train_state import init_train_state, to_batch
    from learners.models.networks import init_policy_params
    from learners.training.mesh import compile_update, make_learner_mesh, put_batch, replicated
    from srl_jax.core.chunk_spec import run_chunk_layout

    config = case_config(case, args)
    spec, policy, network = case_policy(case, config, args)
    T, B = config.actors.trajectory_length, config.learner.batch_envs
    algo = algorithm(config.learner.algorithm)
    acfg, sz = algorithm_config(config), sizes(config)
    optimizer = algo.make_optimizer(acfg, sz)
    mesh = make_learner_mesh(devices, B)
    params = init_policy_params(network, spec.obs_shape, config.seed)
    n_params = sum(x.size for x in jax.tree.leaves(params["net"]))
    state = jax.device_put(init_train_state(params, optimizer, config.seed,
                                            hyper=live_values(algo, acfg)), replicated(mesh))
    layout = run_chunk_layout(config, spec)
    rng = np.random.default_rng(config.seed)
    pool = [random_host_batch(layout, B, spec.action_dim, rng) for _ in range(args.pool)]

    def put(arrays: dict[str, np.ndarray]) -> Any:
        return put_batch(to_batch(arrays), mesh)

    start = time.perf_counter()
    update: Callable = compile_update(algo.make_update(policy, optimizer, acfg, sz), mesh,
                                      state, put(pool[0]))
    compile_s = time.perf_counter() - start

    for i in range(args.warmup):
        state, metrics = update(state, put(pool[i % len(pool)]))
        jax.device_get(metrics)

    repeats: list[dict[str, float]] = []
    for _ in range(args.repeats):
        # Pipelined, as LearnerWorker._train: dispatch, put the next batch, fetch metrics.
        put_s = dispatch_s = wait_s = 0.0
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        following = put(pool[0])  # the prefetch of the update before the loop: not timed
        loop0 = time.perf_counter()
        for i in range(args.updates):
            batch = following
            t0 = time.perf_counter()
            state, metrics = update(state, batch)
            t1 = time.perf_counter()
            following = put(pool[(i + 1) % len(pool)])
            t2 = time.perf_counter()
            jax.device_get(metrics)
            t3 = time.perf_counter()
            dispatch_s += t1 - t0
            put_s += t2 - t1
            wait_s += t3 - t2
        loop_s = time.perf_counter() - loop0
        # Bare: the compiled update alone on a batch already on the mesh.
        bare0 = time.perf_counter()
        for _ in range(args.updates):
            state, metrics = update(state, batch)
            jax.device_get(metrics)
        bare_s = time.perf_counter() - bare0
        cpu_util = (cpu_seconds() - cpu0) / (time.perf_counter() - wall0)
        per_update = loop_s / args.updates
        repeats.append({
            "samples_per_s": T * B / per_update,
            "ms_per_update": 1e3 * per_update,
            "put_ms": 1e3 * put_s / args.updates,
            "dispatch_ms": 1e3 * dispatch_s / args.updates,
            "wait_ms": 1e3 * wait_s / args.updates,
            "outside": 1.0 - (dispatch_s + wait_s) / loop_s,
            "bare_ms": 1e3 * bare_s / args.updates,
            "feed": 1.0 - bare_s / loop_s,
            "cpu": cpu_util,
        })

    first = jax.devices()[0]
    result: dict[str, Any] = {
        "case": case, "devices": mesh.size, "T": T, "B": B, "conv": args.conv,
        "epochs": acfg.epochs, "minibatches": acfg.minibatches,
        "obs": f"{np.dtype(spec.obs_dtype).name}{list(spec.obs_shape)}",
        "actions": spec.action_dim, "params": int(n_params),
        "updates": args.updates, "repeats": args.repeats, "compile_s": compile_s,
        "platform": first.platform, "device_kind": first.device_kind,
        "jax_devices": len(jax.devices()), "jax": jax.__version__,
        "samples_per_s_all": [r["samples_per_s"] for r in repeats],
    }
    for key in repeats[0]:
        result[key] = statistics.median(r[key] for r in repeats)
    return result


def child_main(args: argparse.Namespace) -> int:
    """Run one case in this (fresh) process and print its result line."""
    result = run_case(args.case, args.devices, args)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- parent


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
    return [sys.executable, str(Path(__file__).resolve()), "--case", case,
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


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.system()


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


LEVERS: tuple[tuple[str, str], ...] = (
    ("xla", "XLA's convolution (a GPU's or TPU's choice)"),
    ("matmul", "matmul convolutions (learners/models/conv.py; a CPU's choice)"),
)
"""(network.conv, what it is) of each `--levers` row."""
TORCH_SCRIPT = Path(__file__).resolve().parent / "torch_cnn.py"


def torch_reference(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | str:
    """bench/torch_cnn.py's figures for the sizes of the CNN `case` srl_jax ran, in Sample
    Factory's venv."""
    from sample_factory_peer import ensure_venv

    updates, repeats, _ = timing("cnn", args)
    command = [str(ensure_venv()), str(TORCH_SCRIPT), "--T", str(case["T"]),
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
    from machine import config_hash, write_results

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
        "command": "python bench/learner.py --levers", "levers": rows, "torch": torch_result,
        "experiment": args.experiment.name, "config_sha256": config_hash(args.experiment)})
    print(f"wrote {path}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from srl_jax.config.schema import CONVS

    parser = argparse.ArgumentParser(
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
    parser.add_argument("--experiment", type=Path, default=DEFAULT_EXPERIMENT,
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
