"""Installed, not checked out: the wheel of the repository, installed into a fresh virtual
environment, runs a shipped experiment by name from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def copy_tracked_files(dest: Path) -> Path:
    """What a fresh clone holds (links kept as links), so the build leaves the checkout alone."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        source, target = REPO / name, dest / name
        if not source.exists() and not source.is_symlink():  # deleted, not yet committed
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return dest


UNRELATED = {**os.environ, "PYTHONPATH": ""}
"""The environment of every command here: nothing of the checkout on the path."""


def venv_with(wheel: Path, path: Path) -> Path:
    """A new virtual environment with `wheel` installed, which then sees this one's packages
    (jax, ...) after its own, through a path line; the checkout's editable srl_jax is not
    among them (a path line's own .pth files are not run). Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=60)
    python = path / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], env=UNRELATED, check=True,
                   capture_output=True, timeout=120)
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    ours = [entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")]
    Path(own, "shared.pth").write_text("\n".join(ours) + "\n")
    return python


def test_wheel_installed_in_a_fresh_venv_runs_a_shipped_experiment_from_anywhere(
        tmp_path: Path) -> None:
    source = copy_tracked_files(tmp_path / "source")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "-w", str(wheels), str(source)],
                   env=UNRELATED, check=True, capture_output=True, timeout=180)
    (wheel,) = wheels.glob("srl_jax-*.whl")
    venv = tmp_path / "venv"
    python = venv_with(wheel, venv)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([python, "-c", "from importlib.util import find_spec\n"
                            "for m in ('actors', 'learners', 'srl_jax'): "
                            "print(find_spec(m).origin)"],
                           cwd=elsewhere, env=UNRELATED, capture_output=True, text=True, check=True)
    for module_file in where.stdout.split():
        assert Path(module_file).is_relative_to(venv), where.stdout

    result = subprocess.run(
        [python, "-m", "srl_jax.launch", "cartpole_ppo", "--quiet", "--set",
         "stop.env_frames=2000", "--set", "actors.count=1", "--set", "checkpoint.enabled=false"],
        cwd=elsewhere, env=UNRELATED, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (elsewhere / "runs" / "cartpole_ppo").iterdir()
    assert f"-> runs/cartpole_ppo/{run_dir.name}" in result.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["env_frames"] >= 2000
