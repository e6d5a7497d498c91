"""Run by test_mesh.py in one fresh process with 4 forced CPU devices (XLA_FLAGS): for each
case, one update on 1 device and on 4 devices from the same state and batch; prints the
largest difference of each, and the error a batch that does not divide over them gives."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import jax
import numpy as np

from actors.envs import env_spec
from learners.training.learner import Learner, build_learner
from learners.training.mesh import MeshError, make_learner_mesh
from tests.conftest import make_config, use_test_compilation_cache


def example_window(learner: Learner) -> int:
    """n of a sampled batch's windows (its rewards' second axis)."""
    return learner.inputs.example["rewards"].shape[1]


def one_update(devices: int, algo_name: str, overrides: list[str]) -> tuple[dict, list]:
    config = make_config([f"learner.algorithm={algo_name}", *overrides])
    spec = env_spec(config.env)
    B = config.learner.batch_envs
    learner = build_learner(replace(config, learner=replace(config.learner, devices=devices)),
                            spec, B)
    rng = np.random.default_rng(0)
    arrays = {}
    for name, example in learner.inputs.example.items():  # chunks, or sampled rows
        full, dtype = example.shape, example.dtype
        if dtype == np.bool_ or name in ("terminated", "truncated"):
            arrays[name] = (rng.random(full) < 0.05).astype(dtype)
        elif name == "actions":
            arrays[name] = rng.integers(0, spec.action_dim, full).astype(dtype)
        elif name == "steps":
            arrays[name] = rng.integers(1, example_window(learner) + 1, full).astype(dtype)
        elif name == "logp":
            arrays[name] = np.full(full, np.log(0.5), dtype)
        elif name in ("weights", "probabilities"):
            arrays[name] = rng.uniform(0.1, 1.0, full).astype(dtype)
        else:
            arrays[name] = rng.normal(size=full).astype(dtype)
    arrays["truncated"] = arrays["truncated"] * (1 - arrays["terminated"])
    batch = learner.put(arrays)
    obs = batch["obs"] if isinstance(batch, dict) else batch.obs
    shard_shapes = (sorted({tuple(s.data.shape) for s in obs.addressable_shards})
                    if isinstance(obs, jax.Array) else [obs.shape])  # one CPU device: whole
    learner.step(batch)
    return jax.device_get(learner.params), shard_shapes


def compare(algo_name: str, overrides: list[str]) -> dict:
    one, shards1 = one_update(1, algo_name, overrides)
    four, shards4 = one_update(4, algo_name, overrides)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four), strict=True))
    scale = max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(one))
    return {"max_abs_diff": diff, "scale": scale, "shards_1": shards1, "shards_4": shards4}


def indivisible_error() -> str:
    try:
        make_learner_mesh(0, 6)
    except MeshError as error:
        return str(error)
    return ""


def chosen_devices() -> dict:
    """The devices a placement plan's index list picks, and the error for one too many."""
    try:
        make_learner_mesh([4], 4)
        missing = ""
    except MeshError as error:
        missing = str(error)
    return {"ids": [d.id for d in make_learner_mesh([1, 3], 4).devices.flat],
            "missing_error": missing}


def main() -> None:
    """argv[1]: a JSON list of [algorithm, [override, ...]] cases."""
    cases = json.loads(sys.argv[1])
    use_test_compilation_cache()
    print(json.dumps({"devices": len(jax.devices()), "indivisible_error": indivisible_error(),
                      "chosen": chosen_devices(),
                      "cases": [compare(algo, overrides) for algo, overrides in cases]}))


if __name__ == "__main__":
    main()
