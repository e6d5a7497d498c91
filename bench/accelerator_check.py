"""The prepared accelerator check: what srl_jax does on a GPU or TPU host, in minutes.

For when a machine with an accelerator is at hand (no CI machine has one). It

1. describes the host as the launcher's placement plan sees it
   (`srl_jax.runtime.placement.describe_host`) and stops at once, with one line, where
   there is no accelerator;
2. runs the default experiment (cartpole_ppo) and atari_pong_impala through
   `python -m srl_jax.launch`, each for a bounded time (`--default-seconds`,
   `--atari-seconds`), with the automatic placement plan. While a run goes on it
   samples each process's device memory as the driver reports it (nvidia-smi,
   CUDA context included); afterwards it reads the run's metrics rows (median env
   frames/s and learner samples/s over the rows after the first update, the last
   return), its placement from `status.json`, and the peak device memory each JAX
   worker reported from its allocator's statistics (`<kind>/device_memory_peak_mib`);
3. runs `bench.learner`'s CNN and MLP cases on one device of the accelerator
   (the compiled update alone: samples/s, compile time);
4. prints the figures and writes `bench/results/accelerator.json` (or `--out`).

This parent process never imports JAX, so it holds no device memory itself.

    python -m bench.accelerator_check                      # about 5 minutes
    python -m bench.accelerator_check --atari-seconds 300  # longer Atari run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness.launcher import STOP_GRACE_S, stop_process
from bench.harness.machine import REPO_ROOT, RESULTS_DIR, config_hash, describe, git_commit
from bench.harness.run_rows import read_rows
from bench.learner.case import RESULT_PREFIX
from srl_jax.runtime.host_devices import HostDevices, describe_host
from srl_jax.runtime.placement import JAX_PLATFORM_NAMES
from srl_jax.runtime.run_dir import read_status

RESULTS_NAME = "accelerator"
START_MARGIN_S = 240.0
"""Allowed on top of a run's wall-time limit for start-up (compiles) and shutdown."""
SAMPLE_EVERY_S = 2.0
LEARNER_TIMEOUT_S = 300.0
RUNS = (("default", "cartpole_ppo", "default_seconds"),
        ("atari", "atari_pong_impala", "atari_seconds"))


def driver_memory_mib() -> dict[int, float]:
    """Device memory by pid as the NVIDIA driver reports it ({} without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    used: dict[int, float] = {}
    for line in out.strip().splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        if pid.isdigit() and mib.replace(".", "").isdigit():
            used[int(pid)] = used.get(int(pid), 0.0) + float(mib)
    return used


def run_experiment(experiment: str, seconds: float, run_dir: Path,
                   overrides: list[str]) -> dict[str, Any]:
    """One bounded launcher run; its figures, placement and device memory."""
    command = [sys.executable, "-m", "srl_jax.launch", experiment, "--run-dir", str(run_dir),
               "--quiet", "--set", f"stop.wall_time_s={seconds:g}"]
    for override in overrides:
        command += ["--set", override]
    log_path = run_dir.parent / f"{run_dir.name}.log"
    peak_by_worker: dict[str, float] = {}
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while process.poll() is None:
                if time.monotonic() - started > seconds + START_MARGIN_S + STOP_GRACE_S:
                    break
                status = read_status(run_dir) or {}
                used = driver_memory_mib()
                for worker in status.get("workers", []):
                    if worker.get("pid") in used:
                        peak_by_worker[worker["name"]] = max(
                            peak_by_worker.get(worker["name"], 0.0), used[worker["pid"]])
                time.sleep(SAMPLE_EVERY_S)
        finally:
            stop_process(process, run_dir)
    code = process.returncode
    rows = read_rows(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    status = read_status(run_dir) or {}
    learning = [r for r in rows if r.get("learner_steps", 0) > 0]
    returns = [r["episode_return_mean"] for r in rows if "episode_return_mean" in r]
    allocator = {key: max((r[key] for r in rows if key in r), default=None)
                 for key in ("learner/device_memory_peak_mib", "inference/device_memory_peak_mib",
                             "evaluator/device_memory_peak_mib")}
    return {
        "experiment": experiment, "config_sha256": config_hash(experiment),
        "overrides": overrides, "seconds": seconds, "exit_code": code,
        "log_tail": log_path.read_text(errors="replace").splitlines()[-5:],
        "rows": len(rows), "env_frames": rows[-1]["env_frames"] if rows else 0,
        "learner_steps": rows[-1]["learner_steps"] if rows else 0,
        "first_update_s": learning[0]["time"] if learning else None,
        "fps_median": statistics.median(r["fps"] for r in learning) if learning else None,
        "learner_samples_per_s_median": statistics.median(
            r["learner/samples_per_s"] for r in learning) if learning else None,
        "last_return": returns[-1] if returns else None,
        "stop_reason": status.get("stop_reason"),
        "placement": status.get("placement"),
        "driver_memory_peak_mib": peak_by_worker,
        "allocator_memory_peak_mib": {k: v for k, v in allocator.items() if v is not None},
    }


def learner_case(case: str, host: HostDevices, extra: list[str]) -> dict[str, Any]:
    """`bench.learner`'s case on one device of the accelerator, in a child process."""
    command = [sys.executable, "-m", "bench.learner", "--case", case,
               "--devices", "1", *extra]
    env = {**os.environ, "JAX_PLATFORMS": JAX_PLATFORM_NAMES[host.platform]}
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True,
                                env=env, timeout=LEARNER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"did not finish in {LEARNER_TIMEOUT_S:.0f}s"}
    lines = [line[len(RESULT_PREFIX):] for line in result.stdout.splitlines()
             if line.startswith(RESULT_PREFIX)]
    if not lines:
        return {"case": case, "error": (result.stdout + result.stderr).strip()[-2000:]}
    figures = json.loads(lines[-1])
    keep = ("case", "T", "B", "epochs", "minibatches", "platform", "device_kind",
            "compile_s", "samples_per_s", "ms_per_update", "bare_ms")
    return {key: figures[key] for key in keep if key in figures}


def show(results: dict[str, Any]) -> None:
    print(f"\nhost: {results['host_text']}; jax {results['jax']}")
    for label, run in results["runs"].items():
        fps, samples = run["fps_median"], run["learner_samples_per_s_median"]
        settings = " ".join(run["overrides"])
        print(f"{label} ({run['experiment']} {settings}, {run['seconds']:g}s): exit "
              f"{run['exit_code']}, "
              f"{run['env_frames']} frames, {run['learner_steps']} updates, env frames/s "
              f"{fps if fps is None else round(fps)}, learner samples/s "
              f"{samples if samples is None else round(samples)}, last return "
              f"{run['last_return']}; first update at {run['first_update_s']}s")
        workers = (run.get("placement") or {}).get("workers", {})
        for name, mib in sorted(run["driver_memory_peak_mib"].items()):
            place = workers.get(name, {})
            print(f"    {name:<16} {place.get('platform', '?')} {place.get('devices', '')} "
                  f"share {place.get('memory', '')}: peak {mib:.0f} MiB on the device")
        if run["allocator_memory_peak_mib"]:
            print(f"    allocator peaks (MiB): {run['allocator_memory_peak_mib']}")
    for case in results["learner"]:
        if "error" in case:
            print(f"bench.learner {case['case']}: failed: {case['error'][-300:]}")
        else:
            print(f"bench.learner {case['case']}: {case['samples_per_s']:.0f} samples/s "
                  f"({case['ms_per_update']:.1f} ms/update, T={case['T']} B={case['B']}, "
                  f"compile {case['compile_s']:.1f}s) on {case['device_kind']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--default-seconds", type=float, default=60.0)
    parser.add_argument("--atari-seconds", type=float, default=150.0)
    parser.add_argument("--cnn-batch-envs", type=int, default=32,
                        help="B of bench.learner's CNN case (1 epoch x 2 minibatches of T=32 x B)")
    parser.add_argument("--updates", type=int, default=20,
                        help="timed updates per repeat of bench.learner's cases")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / f"{RESULTS_NAME}.json")
    parser.add_argument("--only", nargs="+", choices=[label for label, _, _ in RUNS],
                        default=[label for label, _, _ in RUNS], help="which runs (default: all)")
    parser.add_argument("--skip-learner", action="store_true",
                        help="leave out bench.learner's cases")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="an override for every run "
                        "(e.g. inference.device_memory=on_demand)")
    parser.add_argument("--on-cpu", action="store_true",
                        help="run the check on a host without an accelerator (to test it)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    host = describe_host()
    if host.platform == "cpu" and not args.on_cpu:
        print(f"accelerator_check: {host.text()} on this host: nothing to check")
        return 0
    print(f"accelerator_check: {host.text()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="srl_jax_accel_"))
    results: dict[str, Any] = {
        "benchmark": RESULTS_NAME, "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": describe(),
        "host": host.__dict__ | {"visible": list(host.visible)}, "host_text": host.text(),
        "jax": metadata.version("jax"), "runs": {}, "learner": []}
    try:
        for label, experiment, option in RUNS:
            if label not in args.only:
                continue
            seconds = getattr(args, option)
            print(f"running {experiment} for {seconds:g}s ...", flush=True)
            results["runs"][label] = run_experiment(experiment, seconds, workdir / label,
                                                    args.overrides)
        timing = ["--updates", str(args.updates), "--repeats", "3", "--warmup", "2"]
        cases = [] if args.skip_learner else [
            ("mlp", timing), ("cnn", [*timing, "--cnn-batch-envs", str(args.cnn_batch_envs)])]
        for case, extra in cases:
            print(f"bench.learner {case} ...", flush=True)
            results["learner"].append(learner_case(case, host, extra))
    finally:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        if args.keep:
            print(f"run directories kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    show(results)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
