"""The learner's data-parallel update: 4 devices give the parameters 1 device gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from learners.training.mesh import make_learner_mesh
from tests.conftest import REPO, make_config

CASES = [
    ("ppo", []),
    ("ppo", ["learner.normalize_obs=true", "learner.ppo.target_kl=0.01"]),
    ("impala", ["learner.normalize_obs=true", "learner.impala.minibatches=4"]),
    ("dqn", ["replay.count=1", "network.head=dueling", "network.activation=relu",
             "learner.normalize_obs=true"]),
]
pytestmark = pytest.mark.slow
"""A fresh interpreter with 4 devices compiles every case: some 20 s on 2 cores, the
largest cost the quick part had (`./test.sh -m "not slow"` took 110 s with it)."""
FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
"""XLA_FLAGS must be set before JAX starts, hence a fresh interpreter."""


@pytest.fixture(scope="module")
def four_device_checks() -> dict:
    """Every case in one interpreter: JAX starts once, not once per case."""
    result = subprocess.run([sys.executable, "-m", "tests.mesh_check", json.dumps(CASES)],
                            cwd=REPO, capture_output=True, text=True, timeout=240,
                            env={**os.environ, **FOUR_DEVICES})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)), ids=[
    f"{algo}-{'+'.join(overrides) or 'defaults'}" for algo, overrides in CASES])
def test_four_devices_match_one(four_device_checks: dict, case: int) -> None:
    assert four_device_checks["devices"] == 4
    out = four_device_checks["cases"][case]
    default = make_config()  # configs/cartpole_ppo.yaml, which the script trains
    T, B = default.actors.trajectory_length, default.learner.batch_envs
    if CASES[case][0] == "dqn":  # B sampled rows
        assert out["shards_1"] == [[B, 4]]
        assert out["shards_4"] == [[B // 4, 4]], "the batch is split on its rows"
    else:
        assert out["shards_1"] == [[T + 1, B, 4]]
        assert out["shards_4"] == [[T + 1, B // 4, 4]], "the batch is split on the env axis"
    assert out["max_abs_diff"] < 1e-5 * max(1.0, out["scale"]), out


def test_batch_that_does_not_divide_over_the_devices_is_a_clear_error(
        four_device_checks: dict) -> None:
    assert four_device_checks["indivisible_error"] == (
        "'learner.batch_envs' (6) must divide evenly over the 4 learner devices")
    assert isinstance(make_learner_mesh(1, 6).size, int)


def test_a_list_of_device_indices_picks_those_devices(four_device_checks: dict) -> None:
    chosen = four_device_checks["chosen"]
    assert chosen["ids"] == [1, 3]
    assert chosen["missing_error"].startswith(
        "'learner.devices' [4] are not all among this process's 4 device(s)")
