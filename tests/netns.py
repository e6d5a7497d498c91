"""Hosts for tests: network namespaces on one switch, each with its own address.

Needs root and iproute2 (CI runs as root); where namespaces cannot be made, the
test that asks for them is skipped with the cause. Each host is a namespace with a veth
link to a bridge in a switch namespace, loopback up and a default route, so a
process in it sees one address, as on a machine of its own. Teardown kills
every process in the namespaces by pid (`ip netns pids`), then deletes them.

`own_disks` also gives each host a filesystem of its own where it matters: every
command of a host runs in a mount namespace of its own (`unshare --mount`) in which
the given paths are that host's own directories, bind-mounted, so two hosts see
different files at one path and nothing that another host writes there. The test,
outside every host, reads each host's files where `Host.outside` says.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

SUBNET = "10.77.0"


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    views: tuple[tuple[str, str], ...] = ()
    """(directory, path): this host sees `directory` at `path` (`own_disks`)."""

    def command(self, *args: str) -> list[str]:
        """`args` run inside this host, in its view of the filesystem."""
        if not self.views:
            return ["ip", "netns", "exec", self.namespace, *args]
        pairs = [part for view in self.views for part in view]
        binds = " && ".join(f'mount --bind "${{{i + 1}}}" "${{{i + 2}}}"'
                            for i in range(0, len(pairs), 2))
        return ["ip", "netns", "exec", self.namespace, "unshare", "--mount", "--propagation",
                "private", "sh", "-c", f'{binds} && shift {len(pairs)} && exec "$@"', "sh",
                *pairs, *args]

    def outside(self, path: str | Path) -> Path:
        """Where a process outside the hosts finds what this host sees at `path`."""
        path = Path(path)
        for directory, inside in self.views:
            if path.is_relative_to(inside):
                return Path(directory) / path.relative_to(inside)
        return path


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


def own_disks(hosts: list[Host], paths: Sequence[Path], disks: Path) -> list[Host]:
    """`hosts`, each seeing a directory of its own, `disks/<namespace>/<n>` (empty at
    first), at the n-th of `paths`, which are made where missing. Skips the test with the
    cause where mount namespaces cannot be made."""
    if shutil.which("unshare") is None:
        pytest.skip("a host's own files need a mount namespace: no 'unshare' (util-linux)")
    disks.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount",
                            "--bind", str(disks), str(disks)], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace: {probe.stderr.strip()}")
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
    result = []
    for host in hosts:
        views = tuple((str(disks / host.namespace / str(n)), str(path))
                      for n, path in enumerate(paths))
        for directory, _ in views:
            Path(directory).mkdir(parents=True)
        result.append(replace(host, views=views))
    return result
