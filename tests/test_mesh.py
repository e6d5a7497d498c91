"""The learner's data-parallel update: 4 devices give the parameters 1 device gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from learners.mesh import make_learner_mesh
from tests.conftest import REPO

FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}


def run_check(algo: str, *overrides: str) -> dict:
    """In a fresh interpreter, since XLA_FLAGS must be set before JAX starts."""
    result = subprocess.run([sys.executable, "-m", "tests.mesh_check", algo, *overrides],
                            cwd=REPO, capture_output=True, text=True, timeout=240,
                            env={**os.environ, **FOUR_DEVICES})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("algo, overrides", [
    ("ppo", []),
    ("ppo", ["learner.normalize_obs=true", "learner.ppo.target_kl=0.01"]),
    ("impala", ["learner.normalize_obs=true", "learner.impala.minibatches=4"]),
])
def test_four_devices_match_one(algo: str, overrides: list[str]) -> None:
    out = run_check(algo, *overrides)
    assert out["devices"] == 4
    T, B = 32, 32  # configs/cartpole_ppo.yaml
    assert out["shards_1"] == [[T + 1, B, 4]]
    assert out["shards_4"] == [[T + 1, B // 4, 4]], "the batch is split on the env axis"
    assert out["max_abs_diff"] < 1e-5 * max(1.0, out["scale"]), out


def test_batch_that_does_not_divide_over_the_devices_is_a_clear_error() -> None:
    code = ("from learners.mesh import MeshError, make_learner_mesh\n"
            "try:\n    make_learner_mesh(0, 6)\nexcept MeshError as e:\n    print(e)\n")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, **FOUR_DEVICES})
    assert "'learner.batch_envs' (6) must divide evenly over the 4 learner devices" \
        in result.stdout, result.stderr
    assert isinstance(make_learner_mesh(1, 6).size, int)
