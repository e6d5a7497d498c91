"""One case of the learner benchmark in this process: the learner's update built as the
learner worker builds it, fed random host batches, timed."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness.machine import CONFIGS_DIR, DEFAULT_EXPERIMENT

if TYPE_CHECKING:
    from srl_jax.config.schema import ExperimentConfig

DEFAULT_CONFIG = CONFIGS_DIR / f"{DEFAULT_EXPERIMENT}.yaml"
CASES = ("mlp", "cnn")
CNN_OBS_SHAPE = (84, 84, 4)
RESULT_PREFIX = "BENCH_RESULT "
"""A child's result line on stdout: this prefix, then one JSON object."""


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
    from srl_jax.dataflow.env_spec import EnvSpec

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

    from learners.algorithms.train_state import init_train_state, to_batch
    from learners.models.networks import init_policy_params
    from learners.training.mesh import compile_update, make_learner_mesh, put_batch, replicated
    from srl_jax.dataflow.algorithms import algorithm, algorithm_config, live_values, sizes
    from srl_jax.dataflow.chunk_spec import run_chunk_layout

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
