"""requirements/*.lock against pyproject.toml: what run.sh and test.sh install is what
pyproject.toml asks for, and a changed requirement without a refreshed lock fails here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = canonicalize_name(PYPROJECT["project"]["name"])
LOCKS = {"": REPO / "requirements" / "base.lock", "dev": REPO / "requirements" / "dev.lock"}
CLUSTER_LOCK = REPO / "requirements" / "cluster.lock"
"""What `srl_jax.cluster tpu-vm` installs on the hosts: the base, `[ray]` and `[tpu]`."""
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def pins(lock: Path) -> dict[str, set[Version]]:
    """Each locked package's versions (several where markers fork the resolution)."""
    found: dict[str, set[Version]] = {}
    for name, version in PIN.findall(lock.read_text()):
        found.setdefault(canonicalize_name(name), set()).add(Version(version))
    return found


def requirements(extra: str) -> list[Requirement]:
    """The build backend, the base dependencies and those of `extra`, with the extras
    it pulls in through the project itself (dev: srl-jax[analysis,...])."""
    wanted = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    wanted += [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    optional = PYPROJECT["project"]["optional-dependencies"]
    pending, seen = [extra] if extra else [], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in map(Requirement, optional[name]):
            if canonicalize_name(requirement.name) == PROJECT:
                pending += sorted(requirement.extras)
            else:
                wanted.append(requirement)
    return wanted


@pytest.mark.parametrize("extra", sorted(LOCKS), ids=["base", "dev"])
def test_lock_pins_every_requirement_within_its_bounds(extra: str) -> None:
    locked = pins(LOCKS[extra])
    for requirement in requirements(extra):
        versions = locked.get(canonicalize_name(requirement.name))
        assert versions, f"{requirement.name} is not in {LOCKS[extra].name}: run scripts/lock.sh"
        outside = [str(v) for v in versions if v not in requirement.specifier]
        assert not outside, (f"{LOCKS[extra].name} pins {requirement.name} {outside}, outside "
                             f"'{requirement}': run scripts/lock.sh")


def test_cluster_lock_pins_the_hosts_requirements_as_the_dev_lock_does() -> None:
    locked, dev = pins(CLUSTER_LOCK), pins(LOCKS["dev"])
    for requirement in requirements("ray") + requirements("tpu"):
        versions = locked.get(canonicalize_name(requirement.name))
        if canonicalize_name(requirement.name) == "setuptools":
            continue  # the hosts install a built wheel
        assert versions and all(v in requirement.specifier for v in versions), \
            f"{CLUSTER_LOCK.name}: {requirement} ({versions}): run scripts/lock.sh"
    assert locked.get("libtpu"), "jax[tpu] brings libtpu"
    differ = {name: (locked[name], dev[name]) for name in locked
              if name in dev and locked[name] != dev[name]}
    assert not differ, "the hosts run the versions the tests ran"
    assert check(REPO / "pyproject.toml", CLUSTER_LOCK).returncode == 0


def test_ruff_is_pinned_exactly() -> None:
    """test.sh fails on any lint rule a newer ruff adds, so no newer one may come in."""
    (ruff,) = [r for r in requirements("dev") if canonicalize_name(r.name) == "ruff"]
    (operator,) = {spec.operator for spec in ruff.specifier}
    assert operator == "=="


def test_base_lock_pins_the_versions_the_dev_lock_pins() -> None:
    """run.sh and test.sh run the same versions of what they share."""
    base, dev = pins(LOCKS[""]), pins(LOCKS["dev"])
    differ = {name: (base[name], dev.get(name)) for name in base if base[name] != dev.get(name)}
    assert not differ


def check(pyproject: Path, lock: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "lockfile.py"), "check",
                           str(pyproject), str(lock)], capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("extra", sorted(LOCKS), ids=["base", "dev"])
def test_lock_records_the_digest_of_pyproject_requirements(extra: str) -> None:
    result = check(REPO / "pyproject.toml", LOCKS[extra])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("old, new", [
    ('"numpy>=2.4.6"', '"numpy>=2.4.7"'),
    ('"ruff==0.17.6"', '"ruff==0.18.0"'),
    ('requires = ["setuptools', 'requires = ["wheel", "setuptools'),
], ids=["base-bound", "dev-pin", "build-backend"])
def test_a_changed_requirement_without_a_refreshed_lock_names_the_refresh_command(
        tmp_path: Path, old: str, new: str) -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert old in text
    changed = tmp_path / "pyproject.toml"
    changed.write_text(text.replace(old, new))
    lock = shutil.copy(LOCKS["dev"], tmp_path / "dev.lock")
    result = check(changed, lock)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"{lock} is stale: the requirements in {changed} changed "
                                     "since it was locked; refresh it with scripts/lock.sh")


def test_a_change_outside_the_requirements_keeps_the_lock(tmp_path: Path) -> None:
    changed = tmp_path / "pyproject.toml"
    changed.write_text((REPO / "pyproject.toml").read_text().replace(
        "line-length = 100", "line-length = 99"))
    assert check(changed, LOCKS["dev"]).returncode == 0
