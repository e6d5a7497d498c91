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
