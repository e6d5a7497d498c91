"""Hosts for tests: network namespaces on one switch, each with its own address.

Needs root and iproute2 (CI runs as root); where namespaces cannot be made, the
test that asks for them is skipped with the cause. Each host is a namespace with a veth
link to a bridge in a switch namespace, loopback up and a default route, so a
process in it sees one address, as on a machine of its own. Teardown kills
every process in the namespaces by pid (`ip netns pids`), then deletes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

SUBNET = "10.77.0"


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str

    def command(self, *args: str) -> list[str]:
        """`args` run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *args]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _kill_all_in(namespace: str) -> None:
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    for pid in listed.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _add_first_namespace(namespace: str) -> None:
    """Add `namespace`, or skip the test with the cause where none can be made (no root,
    no iproute2, a container without CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 ('ip')")
    try:
        _ip("netns", "add", namespace)
    except subprocess.CalledProcessError as error:
        pytest.skip(f"cannot make a network namespace: {(error.stderr or '').strip() or error}")


@contextlib.contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """`count` hosts on one switch, SUBNET.1 upwards; gone again afterwards."""
    tag = f"s{os.getpid() % 100000}"  # interface names stay under 15 characters
    switch = f"{tag}sw"
    _add_first_namespace(switch)
    made = [switch]
    try:
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        result = []
        for i in range(count):
            host = Host(f"{tag}h{i}", f"{SUBNET}.{i + 1}")
            inside, outside = f"{tag}v{i}", f"{tag}w{i}"
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", host.namespace)
            _ip("link", "set", outside, "netns", switch)
            _ip("-n", switch, "link", "set", outside, "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip("-n", host.namespace, "link", "set", inside, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "route", "add", "default", "dev", inside)
            result.append(host)
        yield result
    finally:
        for namespace in made:
            _kill_all_in(namespace)
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
