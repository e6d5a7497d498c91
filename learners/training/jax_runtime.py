"""JAX in a worker process: the set-up shared by the workers that run JAX (learner,
inference server, evaluator) and by a worker forked from the warm parent
(srl_jax/runtime/hosts/fork_setup.py), and the device memory they report."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
from jax._src import config as jax_config

from srl_jax.config.operations import RuntimeConfig


def configure_jax(runtime: RuntimeConfig) -> None:
    """Turn on the persistent compilation cache, so a second run starts in seconds."""
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if runtime.compilation_cache_dir:
        path = os.path.expanduser(runtime.compilation_cache_dir)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")
"""What JAX's `bool_env` takes for true."""


def option_value(option_type: Any, current: Any, raw: str) -> Any:
    """`raw`, a variable's text, as JAX parses it at import for an option of `option_type`
    (`jax.config.meta`'s)."""
    if option_type is bool:
        return raw.lower() in TRUE_WORDS
    if option_type is int:
        return int(raw)
    if option_type is float:
        return float(raw)
    if option_type == "enum_class":
        return type(current)(raw)
    return raw


def config_from_env(env: Mapping[str, str]) -> list[str]:
    """Set every JAX option whose variable (its name in capitals) `env` has, as an import
    of JAX with `env` would have: for a process that imported JAX with none of them set (the
    warm parent) and now has `env`. Returns the options set."""
    names, values = [], jax_config.config.values
    for name, (option_type, _, _) in jax_config.config.meta.items():
        raw = env.get(name.upper())
        if raw is not None:
            jax.config.update(name, option_value(option_type, values[name], raw))
            names.append(name)
    return names


MIB = 2**20


def device_memory_counters(devices: Iterable[jax.Device] | None = None) -> dict[str, float]:
    """`device_memory_mib` and `device_memory_peak_mib` (bytes in use and their peak,
    summed over `devices`; None: the process's default device, where a server's policy
    runs) for a heartbeat; {} where the platform keeps no statistics (the CPU)."""
    stats = []
    for device in jax.local_devices()[:1] if devices is None else devices:
        try:
            stats.append(device.memory_stats())
        except RuntimeError:  # a platform that does not implement them
            continue
    stats = [s for s in stats if s]
    if not stats:
        return {}
    return {"device_memory_mib": sum(s.get("bytes_in_use", 0) for s in stats) / MIB,
            "device_memory_peak_mib": sum(s.get("peak_bytes_in_use", 0) for s in stats) / MIB}
