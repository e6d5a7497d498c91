"""Checkpoint cost: size, save stall, write time and restore time, and what a save in
flight does to the learner's update.

For each case it builds the learner's train state exactly as the learner does
(the algorithm's optimizer, `init_train_state`, replicated on a one-device
mesh) and saves it through `learners.training.checkpoint.Checkpointer`, the class the
learner uses:

- ``mlp``: the default experiment's actor-critic MLP (CartPole), PPO's Adam state;
- ``cnn``: the Nature-CNN of `bench.learner` on 84x84x4 frames, 6 actions.

Per case, ``--repeats`` times (medians printed):

- ``stall_ms``: the time `save` holds the caller with asynchronous saving (the
  learner's default): the copy off the device; the write goes on in a thread;
- ``write_ms``: from `save` until the files are complete on disk (`wait`);
- ``sync_ms``: the same save with `checkpoint.async_save: false`;
- ``restore_ms``: restoring the newest checkpoint into the live state's shapes;
- ``upd_ms`` / ``upd_saving_ms``: one compiled update alone, and one started
  right after `save` returned, while the write runs in its thread (the
  learner's stall beyond `stall_ms`: the two threads share the cores).

``state_MB`` is the bytes of every array of the train state (parameters,
observation statistics, optimizer moments); ``disk_MB`` is one checkpoint
directory on disk. Run from the repository root:

    .venv/bin/python -m bench.checkpoint [--repeats 5] [--cases mlp cnn]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from bench.learner.case import DEFAULT_CONFIG, case_config, case_policy, random_host_batch
from learners.algorithms.train_state import init_train_state, to_batch
from learners.models.networks import init_policy_params
from learners.training.checkpoint import Checkpointer
from learners.training.mesh import compile_update, make_learner_mesh, put_batch, replicated
from srl_jax.config.schema import CONVS
from srl_jax.dataflow.algorithms import algorithm, algorithm_config, live_values, sizes
from srl_jax.dataflow.chunk_spec import run_chunk_layout


def build(case: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(train state on the mesh, compiled update, a batch on the mesh) as the learner has."""
    config = case_config(case, args)
    spec, policy, network = case_policy(case, config, args)
    algo = algorithm(config.learner.algorithm)
    acfg, sz = algorithm_config(config), sizes(config)
    optimizer = algo.make_optimizer(acfg, sz)
    mesh = make_learner_mesh(1, config.learner.batch_envs)
    params = init_policy_params(network, spec.obs_shape, config.seed)
    state = jax.device_put(init_train_state(params, optimizer, config.seed,
                                            hyper=live_values(algo, acfg)), replicated(mesh))
    host = random_host_batch(run_chunk_layout(config, spec), config.learner.batch_envs,
                             spec.action_dim, np.random.default_rng(0))
    batch = put_batch(to_batch(host), mesh)
    update = compile_update(algo.make_update(policy, optimizer, acfg, sz), mesh, state, batch)
    return state, update, batch


def timed_update(update: Any, state: Any, batch: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    state, metrics = update(state, batch)
    jax.block_until_ready(metrics)
    return state, time.perf_counter() - start


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    state, update, batch = build(case, args)
    state, _ = timed_update(update, state, batch)  # warm-up
    n_params = sum(x.size for x in jax.tree.leaves(state.params["net"]))
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state)
                      if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
    samples: dict[str, list[float]] = {k: [] for k in (
        "stall_ms", "write_ms", "sync_ms", "restore_ms", "upd_ms", "upd_saving_ms")}
    with tempfile.TemporaryDirectory() as root:
        run_async, run_sync = Path(root) / "async", Path(root) / "sync"
        saver = Checkpointer(run_async, keep=2, keep_best=False)
        sync_saver = Checkpointer(run_sync, keep=2, keep_best=False, async_save=False)
        for repeat in range(args.repeats):
            step = 2 * repeat + 1
            state, alone = timed_update(update, state, batch)
            stall = saver.save(step, state, {"version": step})
            state, while_saving = timed_update(update, state, batch)
            saver.wait()
            start = time.perf_counter()
            saver.save(step + 1, state, {"version": step + 1})
            saver.wait()
            samples["write_ms"].append((time.perf_counter() - start) * 1e3)
            samples["stall_ms"].append(stall * 1e3)
            samples["upd_ms"].append(alone * 1e3)
            samples["upd_saving_ms"].append(while_saving * 1e3)
            samples["sync_ms"].append(sync_saver.save(step, state, {"version": step}) * 1e3)
            start = time.perf_counter()
            jax.block_until_ready(saver.restore(state).state)
            samples["restore_ms"].append((time.perf_counter() - start) * 1e3)
        disk = directory_bytes(run_async / "checkpoints" / str(2 * args.repeats))
        saver.close()
        sync_saver.close()
    return {"case": case, "params": n_params, "state_MB": state_bytes / 1e6,
            "disk_MB": disk / 1e6, **{k: statistics.median(v) for k, v in samples.items()}}


def print_table(results: list[dict[str, Any]]) -> None:
    columns = ["case", "params", "state_MB", "disk_MB", "stall_ms", "write_ms", "sync_ms",
               "restore_ms", "upd_ms", "upd_saving_ms"]
    rows = [[f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in columns]
            for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=["mlp", "cnn"], default=["mlp", "cnn"])
    parser.add_argument("--repeats", type=int, default=5, help="saves per case (median)")
    parser.add_argument("--experiment", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--cnn-batch-envs", type=int, default=8)
    parser.add_argument("--cnn-epochs", type=int, default=1)
    parser.add_argument("--cnn-minibatches", type=int, default=2)
    parser.add_argument("--cnn-actions", type=int, default=6)
    parser.add_argument("--conv", choices=CONVS, default="auto",
                        help="network.conv of the cases (as bench.learner's)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; medians of {args.repeats} "
          "saves per case", flush=True)
    print_table([run_case(case, args) for case in args.cases])
    return 0


if __name__ == "__main__":
    sys.exit(main())
