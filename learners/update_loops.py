"""The update's gradient-step loops (epochs, minibatches): scanned, or unrolled on XLA:CPU.

XLA:CPU's `ConvCanonicalization` pass rewrites convolutions to its Eigen layout only
in the entry computation, so a convolution or its gradient inside a while loop's body
or a conditional's branch runs on the naive loop emitter, about ten times slower (JAX
issue 12868). Unrolled, every step is in the entry computation; measured on the
Nature-CNN's PPO update, 2 minibatches, 2 CPU cores: scanned 88 samples/s, unrolled
778 (`bench/learner.py --levers`). GPUs and TPUs run loops well, and unrolling would
only multiply their compile time, so they keep the scan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def unroll_loops(setting: str) -> bool:
    """Whether `learner.update_loops` unrolls here: auto unrolls where JAX runs on the
    CPU."""
    if setting == "auto":
        return jax.default_backend() == "cpu"
    return setting == "unrolled"


def step_loop(body: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any,
              unrolled: bool) -> tuple[Any, Any]:
    """`jax.lax.scan(body, init, xs)`, every step written out when `unrolled`."""
    return jax.lax.scan(body, init, xs, unroll=True if unrolled else 1)
