"""No port without authentication off loopback unless the config opts in: the
jax.distributed coordinator and a local Ray instance (the ZMQ ports are
test_transport.py's)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from learners.training.distributed import coordinator_host
from srl_jax.config.checks import check_exposure
from srl_jax.launch import main as launch_main
from tests.conftest import make_config
from tests.test_config import assert_one_config_error_line

TWO_LEARNERS = ("--set", "learner.processes=2", "--set", "actors.splits=4")
OPT_IN = ("--set", "transport.allow_unauthenticated=true")


@pytest.mark.parametrize("args, auth_mode, fragment", [
    ([*TWO_LEARNERS, "--set", "learner.coordinator_address=10.0.0.1:1234"], None,
     "'learner.coordinator_address' 10.0.0.1:1234: the jax.distributed coordinator has no "
     "authentication; bind it to loopback or set 'transport.allow_unauthenticated: true'"),
    ([*TWO_LEARNERS, "--backend", "ray", "--ray-address", "10.0.0.1:6379"], None,
     "'learner.processes' 2 across a Ray cluster: the jax.distributed coordinator (gRPC, no "
     "authentication) would listen on the network; set 'transport.allow_unauthenticated: "
     "true'"),
    (["--backend", "ray"], "disabled",
     "RAY_AUTH_MODE=disabled: the local Ray instance would listen on every interface without "
     "token authentication; unset it or set 'transport.allow_unauthenticated: true'"),
])
def test_an_unauthenticated_port_off_loopback_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        args: list[str], auth_mode: str | None, fragment: str) -> None:
    """Refused before anything starts; the same run with the opt-in passes the check."""
    if auth_mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", auth_mode)
    code = launch_main(["cartpole_ppo", *args, "--run-dir", str(tmp_path / "run")])
    stdout, stderr = capsys.readouterr()
    assert_one_config_error_line(code, stdout, stderr, fragment)
    assert not (tmp_path / "run").exists(), "nothing may start before validation passes"
    overrides = [v for k, v in itertools.pairwise(args) if k == "--set"]
    config = make_config([*overrides, OPT_IN[1]])
    backend = args[args.index("--backend") + 1] if "--backend" in args else "local"
    address = args[args.index("--ray-address") + 1] if "--ray-address" in args else ""
    check_exposure(config, backend, address, {"RAY_AUTH_MODE": auth_mode or "token"})


def test_the_refusal_exits_2_from_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--backend", "ray",
         "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert_one_config_error_line(result.returncode, result.stdout, result.stderr,
                                 "RAY_AUTH_MODE=disabled: the local Ray instance")


def test_the_coordinator_binds_loopback_unless_the_config_opts_in() -> None:
    assert coordinator_host(make_config(), "10.0.0.2") == "127.0.0.1"
    assert coordinator_host(make_config([OPT_IN[1]]), "10.0.0.2") == "10.0.0.2"
