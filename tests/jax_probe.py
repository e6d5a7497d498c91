"""`python -m tests.jax_probe OUT`: writes to OUT, as JSON, what this process's JAX and
process set-up are (jax.config, the environment, OpenBLAS's threads, its session, its name
in `ps`, and its devices where it runs on the CPU), for tests/test_warm_parent.py to
compare a worker forked warm with one started fresh."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import jax

GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
           "openblas_get_num_threads")


def blas_threads() -> int | None:
    maps = Path("/proc/self/maps").read_text().splitlines()
    for path in {line.split()[-1] for line in maps if "openblas" in line and "/" in line}:
        library = ctypes.CDLL(path)
        for getter in GETTERS:
            if hasattr(library, getter):
                return getattr(library, getter)()
    return None


def main(out: str) -> None:
    report = {
        "jax_config": {name: repr(value) for name, value in jax.config.values.items()},
        "environ": dict(os.environ), "blas_threads": blas_threads(),
        "session_leader": os.getsid(0) == os.getpid(),
        "stdin": os.readlink("/proc/self/fd/0"),
        "cmdline": Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(),
    }
    if os.environ.get("JAX_PLATFORMS") == "cpu":
        report["devices"] = jax.device_count()
    print("probe ran", flush=True)
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
