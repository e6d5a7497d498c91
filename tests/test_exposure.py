"""No port without authentication off loopback unless the config opts in: the
jax.distributed coordinator, the learners' collectives (gloo, NCCL) and a local Ray
instance (the ZMQ ports are test_transport.py's; a two-learner run's every listening
socket, test_distributed.py's)."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from learners.training.collectives import (
    NCCL_IFNAME,
    listening_sockets,
    note_new_ports,
    pin_nccl,
)
from learners.training.distributed import coordinator_host
from srl_jax.config.checks import check_exposure
from srl_jax.launch import main as launch_main
from srl_jax.wire.names import FileNameService
from srl_jax.wire.transport import Transport
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


def test_nccl_listens_on_the_interface_of_the_collectives_address() -> None:
    """Loopback's interface exactly ('=lo'), unless the environment names one; an address
    no interface here holds leaves NCCL to pick."""
    for host, given, wanted in (("127.0.0.1", {}, "=lo"),
                                ("localhost", {NCCL_IFNAME: "ib0"}, "ib0"),
                                ("collectives.invalid", {}, None)):
        pin_nccl(host, given)
        assert given.get(NCCL_IFNAME) == wanted, host


def test_ports_opened_outside_the_transport_are_found_and_listed(tmp_path: Path) -> None:
    """What gloo and NCCL open, as `note_new_ports` finds it: this process's listening
    sockets (an IPv4 one, and one of IPv6 with an IPv4-mapped address), less the ports the
    transport lists already, which are not listed twice."""
    context = zmq.Context()
    transport = Transport(context)
    bound = context.socket(zmq.PULL)
    with socket.socket() as four, socket.socket(socket.AF_INET6) as six:
        try:
            transport.bind(bound, FileNameService(tmp_path), "port.test")
            four.bind(("127.0.0.1", 0))
            six.bind(("::ffff:127.0.0.1", 0))
            for listener in (four, six):
                listener.listen()
            ports = {four.getsockname()[1], six.getsockname()[1]}
            assert {("127.0.0.1", port) for port in ports} <= listening_sockets()
            new = note_new_ports(transport, "jax.test")
            assert sorted(new) == sorted(f"127.0.0.1:{port}" for port in ports)
            assert [p.key for p in transport.ports] == ["port.test", "jax.test", "jax.test"]
            assert note_new_ports(transport, "jax.test") == []
        finally:
            bound.close(linger=0)
            transport.close()
            context.term()
