"""A path the launcher or `srl_jax.evaluate` cannot use is one line and exit code 2, as a
bad config is: the run directory, `checkpoint.dir` and the plugins, refused before any
worker starts, each line naming the path and why (the system's reason)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

UNWRITABLE = {os.strerror(code) for code in (errno.EACCES, errno.EPERM, errno.EROFS)}
"""What a directory this process may not write in is refused with (sysfs, to root too)."""
BROKEN_PLUGIN = "import no_such_dependency\n"

CASES = {
    "run dir impossible": (["--run-dir", "/proc/forbidden"],
                           "'--run-dir': /proc/forbidden", {"No such file or directory"}),
    "run dir a file": (["--run-dir", "{tmp}/file"], "'--run-dir': {tmp}/file", {"File exists"}),
    "run dir under a file": (["--run-dir", "{tmp}/file/run"], "'--run-dir': {tmp}/file/run",
                             {"Not a directory"}),
    "run dir unwritable": (["--run-dir", "/sys/kernel/srl_jax_run"],
                           "'--run-dir': /sys/kernel/srl_jax_run", UNWRITABLE),
    "checkpoint dir impossible": (["--set", "checkpoint.dir=/proc/forbidden/ckpt"],
                                  "'checkpoint.dir': /proc/forbidden/ckpt",
                                  {"No such file or directory"}),
    "checkpoint dir a file": (["--set", "checkpoint.dir=file://{tmp}/file"],
                              "'checkpoint.dir': {tmp}/file", {"File exists"}),
    "checkpoint dir unwritable": (["--set", "checkpoint.dir=/sys/kernel"],
                                  "'checkpoint.dir': /sys/kernel", UNWRITABLE),
    "plugin missing": (["--set", "plugins=[no_such_plugin]"],
                       "'plugins[0]': cannot import 'no_such_plugin'",
                       {"No module named 'no_such_plugin'"}),
    "plugin fails to import": (["--set", "plugins=[broken_plugin]"],
                               "'plugins[0]': cannot import 'broken_plugin'",
                               {"No module named 'no_such_dependency'"}),
    "plugin a path": (["--set", "plugins=[{tmp}/broken_plugin.py]"],
                      "'plugins[0]': '{tmp}/broken_plugin.py'", {"(my_package.algo)"}),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_path_is_one_line_and_exit_code_2(tmp_path: Path, case: str) -> None:
    """The real launcher, in a process of its own: the line says what the path is for, the
    path and the reason; no run directory is made."""
    args, names, reasons = CASES[case]
    (tmp_path / "file").write_text("")
    (tmp_path / "broken_plugin.py").write_text(BROKEN_PLUGIN)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "srl_jax.launch", "cartpole_ppo", "--quiet",
               "--run-dir", str(run_dir), *(arg.format(tmp=tmp_path) for arg in args)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"srl_jax.launch: config error: {names.format(tmp=tmp_path)}"), line
    assert any(line.endswith(f" {reason}") for reason in reasons), line
    assert result.stdout == ""
    assert not run_dir.exists(), "nothing may start before the paths are checked"


def test_evaluating_a_bad_run_dir_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "srl_jax.evaluate", "/proc/forbidden"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("srl_jax.evaluate: /proc/forbidden "), line
    assert result.stdout == ""
