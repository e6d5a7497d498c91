"""The machine a benchmark ran on, and the results files that record it: figures from
two machines are not comparable, so every results JSON says which one it came from, at
which commit, and which version of a config it measured (`config_hash`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout the benchmarks measure: launcher runs start here."""
RESULTS_DIR = REPO_ROOT / "bench" / "results"
CONFIGS_DIR = REPO_ROOT / "configs"
DEFAULT_EXPERIMENT = "cartpole_ppo"
"""The project's default experiment: what `./run.sh` runs without an argument."""
PACKAGES = ("jax", "jaxlib", "flax", "optax", "pyzmq", "numpy", "gymnasium", "msgpack")


def nproc() -> int:
    """CPUs this process may run on, as `nproc` counts them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict[str, Any]:
    """Cores, CPU model, memory, OS, Python and the versions of the packages that set speed."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    memory_gib = None
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "cores": nproc(), "cpu": cpu_model(), "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
        "python": platform.python_version(), "packages": versions,
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def config_hash(experiment: str | Path, configs_dir: Path = CONFIGS_DIR) -> str:
    """The sha256 (first 16 hex digits) of a config's settings, comments and layout aside:
    which version was measured. `experiment` is a shipped config's name or a YAML file's
    path."""
    path = Path(experiment)
    if path.suffix not in (".yaml", ".yml"):
        path = configs_dir / f"{experiment}.yaml"
    settings = json.dumps(yaml.safe_load(path.read_text()), sort_keys=True)
    return hashlib.sha256(settings.encode()).hexdigest()[:16]


def git_commit() -> str:
    """The commit the figures are measured at (short hash, "+dirty" with local changes to
    anything but the results files)."""
    try:
        run = functools.partial(subprocess.run, cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, check=True)
        commit = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                     ":!bench/results"]).stdout.strip()  # a results file is not the code
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_results(name: str, results: dict[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """`<directory>/<name>.json` with the machine, the date and the commit beside the
    figures."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    document = {"benchmark": name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "commit": git_commit(), "machine": describe(), **results}
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
