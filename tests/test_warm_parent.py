"""A worker forked by the warm parent is set up as one started fresh with the same
environment would be, for each placement case; a warm parent with a second thread refuses
to fork, and the worker starts fresh instead. (A warm parent killed mid-run is restarted
and the run goes on: tests/test_faults.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srl_jax.dataflow.worker_kinds import PARENT_PIDFD_ENV, worker_kind
from srl_jax.runtime.backends import spawn_worker, warm_address, worker_env
from srl_jax.runtime.host_devices import HostDevices
from srl_jax.runtime.hosts.warm_client import WarmChild, WarmParent
from srl_jax.runtime.placement import plan_placement
from tests.conftest import make_config
from tests.test_placement import TPU_HOST, gpus

PROBE = ["-m", "tests.jax_probe"]
CASES = {  # name: (host, overrides, worker, the launcher's additions)
    "cpu": (HostDevices(), [], "learner-0",
            {"JAX_ENABLE_X64": "true", "JAX_DEFAULT_MATMUL_PRECISION": "highest"}),
    "cpu, two forced devices": (HostDevices("cpu", 2), ["learner.devices=2"], "learner-0",
                                {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
    "gpu": (gpus(2), [], "inference-0", {"OPENBLAS_NUM_THREADS": "1"}),
    "tpu": (TPU_HOST, [], "learner-0", {"JAX_TRACEBACK_FILTERING": "off"}),
}


def case_env(host: HostDevices, overrides: list[str], worker: str,
             launcher: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment the local backend gives `worker` of the case's plan."""
    placement = plan_placement(make_config(overrides), host)
    launched = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"), **launcher}
    kind = worker_kind(worker.rsplit("-", 1)[0])
    return worker_env({**launched, **kind.start_env(launched), **placement.env(worker)}, None)


def test_a_forked_worker_is_set_up_as_a_fresh_one_for_each_placement_case(
        tmp_path: Path) -> None:
    warm = WarmParent(warm_address(tmp_path.name), tmp_path / "warm_parent.log", os.environ)
    envs = {name: case_env(*case, tmp_path) for name, case in CASES.items()}
    fresh = {name: subprocess.Popen([sys.executable, *PROBE, str(tmp_path / f"{i}.fresh")],
                                    env=env, stdout=subprocess.DEVNULL)
             for i, (name, env) in enumerate(envs.items())}
    for i, (name, env) in enumerate(envs.items()):
        child = warm.fork([*PROBE, str(tmp_path / f"{i}.forked")], env,
                          tmp_path / "logs" / f"{i}.log")
        assert isinstance(child, WarmChild), name
        assert child.wait(timeout=60) == 0, (tmp_path / "logs" / f"{i}.log").read_text()
        assert fresh[name].wait(timeout=60) == 0, name
        forked = json.loads((tmp_path / f"{i}.forked").read_text())
        started = json.loads((tmp_path / f"{i}.fresh").read_text())
        assert forked["environ"].pop(PARENT_PIDFD_ENV).isdigit(), "it watches its starter"
        assert forked["jax_config"] == started["jax_config"], name
        assert forked["environ"] == started["environ"], name
        assert forked["blas_threads"] == started["blas_threads"], name
        assert forked.get("devices") == started.get("devices"), name
        assert forked["session_leader"] and forked["stdin"] == "/dev/null"
        assert forked["cmdline"].startswith(f"{sys.executable} -m tests.jax_probe "), \
            "named in ps as a started worker is"
        assert (tmp_path / "logs" / f"{i}.log").read_text() == "probe ran\n"
    assert json.loads((tmp_path / "1.forked").read_text())["devices"] == 2
    assert warm.describe()["forks"] == len(CASES) and warm.describe()["starts"] == 1
    warm.close()
    assert warm.process.returncode == 0, "it left with its last client"


@pytest.mark.parametrize("preload", [("tests.thread_starter",)])
def test_a_warm_parent_with_a_thread_refuses_to_fork_and_the_worker_starts_fresh(
        tmp_path: Path, preload: tuple[str, ...]) -> None:
    warm = WarmParent(warm_address(tmp_path.name), tmp_path / "warm_parent.log", os.environ,
                      preload=preload)
    env = worker_env({**os.environ, "JAX_PLATFORMS": "cpu"}, None)
    process = spawn_worker([*PROBE, str(tmp_path / "probe")], env, tmp_path / "worker.log",
                           warm=warm)
    assert isinstance(process, subprocess.Popen), "started fresh"
    assert process.wait(timeout=60) == 0
    assert json.loads((tmp_path / "probe").read_text())["devices"] == 1
    log = (tmp_path / "warm_parent.log").read_text()
    assert "refused to fork" in log and "a stray thread" in log, log
    assert warm.describe()["forks"] == 0
    warm.close()
