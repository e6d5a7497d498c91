"""JAX process set-up shared by the workers that run JAX (learner, inference server)."""

from __future__ import annotations

import logging
import os

import jax

from srl_jax.config.operations import RuntimeConfig


def configure_jax(runtime: RuntimeConfig) -> None:
    """Turn on the persistent compilation cache, so a second run starts in seconds."""
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if runtime.compilation_cache_dir:
        path = os.path.expanduser(runtime.compilation_cache_dir)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
