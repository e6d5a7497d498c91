"""What a worker forked from the warm parent (srl_jax/runtime/hosts/warm_parent.py) does
before it runs, so that it is the process a fresh interpreter with its environment would
have been: what is read once, at process start or at import, is set again from its own
environment.

- JAX reads each config option's variable (`JAX_PLATFORMS`, `JAX_COMPILATION_CACHE_DIR`,
  ...) into `jax.config` at import: the warm parent imported JAX with none of them set, so
  the child sets each one its environment has through `jax.config.update`. What XLA reads
  when a backend starts (`XLA_FLAGS`, `CUDA_VISIBLE_DEVICES`) is read later, from the
  child's environment.
- glibc reads its `MALLOC_*` tunables at process start: the child sets them with `mallopt`.
- OpenBLAS starts its threads when numpy loads it: the warm parent loaded it with one (a
  second thread would make forking unsafe), the child sets the count a fresh process
  would have.
- Its output goes to its log, stdin is /dev/null, it leads a session of its own, and it
  names itself in `ps` as a started worker is named (`python -m srl_jax.worker KIND ...`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import logging
import os
import runpy
import sys
from collections.abc import Mapping
from pathlib import Path

import setproctitle

from srl_jax.dataflow.worker_kinds import KINDS, PARENT_PIDFD_ENV

MALLOC_OPTIONS = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2,
                  "MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_MMAP_MAX_": -4,
                  "MALLOC_ARENA_TEST": -7, "MALLOC_ARENA_MAX": -8}
"""glibc's variables read at process start, and their `mallopt` parameters (malloc.h)."""
BLAS_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
"""Where OpenBLAS takes its thread count from, first set first (else every core)."""
BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                "openblas_set_num_threads")
"""OpenBLAS's setter under the names its builds export (numpy's wheels: the first)."""
JAX_CONFIG_ENTRY = "learners.training.jax_runtime:config_from_env"
"""Sets `jax.config` from an environment (JAX is the learner side's to import)."""


def worker_modules() -> list[str]:
    """The modules of the kinds forked warm (`WorkerKind.warm`), variants included."""
    entries = [entry for kind in KINDS.values() if kind.warm
               for entry in [kind.entry, *([kind.variant[1]] if kind.variant else [])]]
    return sorted({entry.partition(":")[0] for entry in entries})


def warm_parent_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The warm parent's own environment: the launcher's without JAX's variables (each child
    sets its own), and OpenBLAS with one thread."""
    env = {name: value for name, value in environ.items() if not name.startswith("JAX_")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def set_malloc(env: Mapping[str, str]) -> None:
    libc = ctypes.CDLL(None)
    for name, parameter in MALLOC_OPTIONS.items():
        if name in env:
            libc.mallopt(parameter, int(env[name]))


def blas_threads(env: Mapping[str, str]) -> int:
    """The threads OpenBLAS starts with in a fresh process with `env`."""
    for name in BLAS_THREADS_ENV:
        with contextlib.suppress(ValueError):
            if int(env.get(name, "0")) > 0:
                return int(env[name])
    return len(os.sched_getaffinity(0))


def set_blas_threads(env: Mapping[str, str]) -> None:
    maps = Path("/proc/self/maps").read_text().splitlines()
    libraries = {line.split()[-1] for line in maps if "openblas" in line and "/" in line}
    for path in libraries:
        library = ctypes.CDLL(path)
        for setter in BLAS_SETTERS:
            if hasattr(library, setter):
                getattr(library, setter)(blas_threads(env))
                break


def redirect_output(log_path: str, unbuffered: bool) -> None:
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.close(null_fd)
    if unbuffered:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(line_buffering=True, write_through=True)


def run_forked(args: list[str], env: dict[str, str], log_path: str, parent_pidfd: int) -> int:
    """Become the worker `python args...` with `env`, watching `parent_pidfd`; its exit code."""
    os.setsid()
    redirect_output(log_path, "PYTHONUNBUFFERED" in env)
    os.environ.clear()
    os.environ.update({**env, PARENT_PIDFD_ENV: str(parent_pidfd)})
    set_malloc(env)
    set_blas_threads(env)
    module, _, function = JAX_CONFIG_ENTRY.partition(":")
    getattr(importlib.import_module(module), function)(env)
    setproctitle.setproctitle(" ".join([sys.executable, *args]))
    for handler in logging.root.handlers[:]:  # the warm parent's: the worker sets its own
        logging.root.removeHandler(handler)
    if args[:1] != ["-m"] or len(args) < 2:
        raise ValueError(f"a warm parent runs modules (-m NAME ...), not {args}")
    sys.argv = [args[1], *args[2:]]
    try:
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    return 0
