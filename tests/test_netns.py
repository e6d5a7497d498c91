"""The namespace hosts of tests/netns.py skip, saying why, where namespaces cannot be made."""

from __future__ import annotations

import subprocess

import pytest

from tests import netns


def refuse(*args: str) -> None:
    raise subprocess.CalledProcessError(
        1, ["ip", *args], stderr="mount --make-shared /run/netns failed: Operation not permitted\n")


def test_hosts_skip_with_the_cause_where_ip_cannot_make_a_namespace(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(netns, "_ip", refuse)
    with pytest.raises(pytest.skip.Exception,
                       match="cannot make a network namespace: mount --make-shared /run/netns "
                             "failed: Operation not permitted"), netns.hosts(2):
        pytest.fail("no hosts were made")


def test_hosts_skip_without_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(netns, "_ip", refuse)
    with pytest.raises(pytest.skip.Exception, match="need root and iproute2"), netns.hosts(2):
        pytest.fail("no hosts were made")


def test_each_host_sees_its_own_files_at_one_path(tmp_path):
    """What one host writes at a path of its own disk, the other does not see there, nor
    the machine outside: it is in that host's directory."""
    shared = tmp_path / "shared"
    with netns.hosts(2) as plain:
        first, second = netns.own_disks(plain, [shared], tmp_path / "disks")
        subprocess.run(first.command("sh", "-c", f"echo mine > {shared}/file"), check=True)
        seen = subprocess.run(second.command("ls", "-A", str(shared)), check=True,
                              capture_output=True, text=True).stdout
    assert seen == "", "the second host sees none of the first host's files"
    assert list(shared.iterdir()) == [], "nor does the machine outside the hosts"
    assert first.outside(shared / "file").read_text() == "mine\n"
    assert not second.outside(shared / "file").exists()


def test_own_disks_skip_with_the_cause_where_no_mount_namespace_can_be_made(
        monkeypatch, tmp_path):
    monkeypatch.setattr(netns.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(netns.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "unshare: unshare failed: Operation not permitted\n"))
    host = netns.Host("h0", "10.77.0.1")
    with pytest.raises(pytest.skip.Exception, match="cannot make a mount namespace: unshare: "
                                                    "unshare failed: Operation not permitted"):
        netns.own_disks([host], [tmp_path / "shared"], tmp_path / "disks")
