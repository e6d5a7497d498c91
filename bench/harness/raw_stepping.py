"""The raw env stepping rate: environments stepped with random actions in a plain loop, no
sockets and no policy, the ceiling the distributed system is compared with."""

from __future__ import annotations

import multiprocessing
import statistics
import time
from typing import Any

from bench.harness.machine import nproc

RAW_REPEATS = 3


def raw_env_rates(env: dict[str, Any], num_envs: int, total_s: float,
                  repeats: int = RAW_REPEATS, seed: int = 0) -> list[float]:
    """Steps/s of `num_envs` environments stepped in one loop: `repeats` measurements."""
    import numpy as np

    from actors.envs import make_env
    from srl_jax.config.loader import config_from_dict

    config = config_from_dict({"env": env}).env  # all of it: Atari preprocessing included
    envs = [make_env(config) for _ in range(num_envs)]
    try:
        for i, e in enumerate(envs):
            e.reset(seed=seed + i)
        num_actions = int(envs[0].action_space.n)
        rng = np.random.default_rng(seed)

        def measure(seconds: float) -> float:
            steps, started = 0, time.perf_counter()
            deadline = started + seconds
            while (now := time.perf_counter()) < deadline or steps == 0:
                actions = rng.integers(num_actions, size=num_envs)
                for e, action in zip(envs, actions.tolist(), strict=True):
                    _, _, terminated, truncated, _ = e.step(action)
                    if terminated or truncated:
                        e.reset()
                steps += num_envs
            return steps / (now - started)

        measure(min(0.2, total_s / 10))  # warm-up
        return [measure(total_s / repeats) for _ in range(repeats)]
    finally:
        for e in envs:
            e.close()


def _raw_worker(env: dict[str, Any], num_envs: int, seconds: float, seed: int) -> float:
    return statistics.median(raw_env_rates(env, num_envs, seconds, seed=seed))


def raw_rate_on_all_cores(env: dict[str, Any], num_envs: int, seconds: float) -> float:
    """Env steps/s of one stepping process per core, all at once, summed."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(nproc()) as pool:
        rates = pool.starmap(_raw_worker, [(env, num_envs, seconds, 1000 * i)
                                           for i in range(nproc())])
    return sum(rates)
