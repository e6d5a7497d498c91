"""Every command the README and the docs tell a user to type runs here and exits 0.

The commands are the lines of the ```bash blocks of README.md and docs/*.md (the generated
reference pages hold none), typed as a user would, in order, in one fresh directory, with the
fewest changes that keep them short and local: a launch gets a frame limit appended (STOP),
`<timestamp>` names the run an earlier command made (PLACEHOLDERS), `--submit` is left out
(DROPPED). A command that cannot run here (it reaches other machines or the package index, or
is the suite itself) is in NOT_RUN with the reason; any other command must run, so a new
example is run as soon as it is written. Its runs directory, `runs/`, lies under tmp_path.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
CONFIG_FILE = re.compile(r"\A# (configs/[\w.-]+\.yaml)\n")
"""A yaml block that starts with its path, as the README's first experiment does, is
written there before the commands run: the commands that name it find it in ./configs."""
COMMAND_START = re.compile(r"^(?:python|\.venv/|\./|bash |pip )", re.M)

PROGRAMS = {"python": [sys.executable], ".venv/bin/python": [sys.executable],
            "./run.sh": [sys.executable, "-m", "srl_jax.launch"]}
"""How the test types each program. run.sh is the launcher in .venv, after it installs
.venv from requirements/base.lock on first use (the index: network); the suite runs in a
.venv made from requirements/dev.lock, a superset of it."""
RUN_SH_EXPERIMENT = re.search(r'set -- (\S+) "\$@"', (REPO / "run.sh").read_text())[1]
"""What run.sh launches when its first argument is no experiment, read from run.sh."""
STOP = ["--set", "stop.env_frames=2000"]
"""Appended to every launch: it stops at its first metrics row past 2000 frames."""
PLACEHOLDERS = {re.compile(r"runs/([\w.-]+)/<timestamp>"):
                "the first run directory an earlier command made under runs/<experiment>/"}
DROPPED = {"--submit": "hands the script to sbatch, which submits it to a Slurm cluster: the "
                       "script is generated, not submitted"}
NOT_RUN = {
    "./test.sh": "the test suite itself",
    "pip install": "installs from the package index (network); tests/test_install.py "
                   "installs the wheel in a fresh venv offline",
    "scripts/lock.sh": "resolves the locks against the package index (network)",
    ".venv/bin/mkdocs build": "./test.sh builds the site, --strict, before the suite",
    ".venv/bin/mypy": "./test.sh runs the type checker before the suite",
    ".venv/bin/mkdocs serve": "a server that runs until stopped; it serves the site "
                              "./test.sh builds",
    ".venv/bin/python -m bench.": "a benchmark: measures for minutes to an hour and writes "
                                  "bench/results/; tests/test_bench_report.py runs "
                                  "`bench.report --check`",
    "python -m srl_jax.launch cartpole_ppo --backend ray":
        "tests/test_ray_backend.py runs it on a local Ray instance (with a run directory "
        "and overrides: to 300, through a killed worker; a second start of Ray here took the "
        "suite's 2 cores 11 s); with --ray-address HEAD:6379 it joins a cluster (remote)",
    "gcloud ": "creates or reaches Google Cloud machines (remote)",
    "for vm in": "gcloud ssh to each CPU VM (remote)",
    "bash cp.sh": "the TPU VM script reaches the hosts over gcloud (remote); "
                  "tests/test_cluster_scripts.py runs it against a gcloud stand-in",
}
"""Documented commands the test does not run, by how they start, with the reason."""
LAUNCH_TIMEOUT_S = 180


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    argv: tuple[str, ...]

    @property
    def text(self) -> str:
        return shlex.join(self.argv)

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def blocks(language: str | None = None) -> list[tuple[Path, int, str, str]]:
    """(page, first line, language, body) of every fenced block, or those of `language`."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if language in (None, match[1]):
                found.append((page, text.count("\n", 0, match.start(2)) + 1, match[1],
                              match[2]))
    return found


def documented_commands() -> list[Command]:
    """Each command of the bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for page, first, _, body in blocks("bash"):
        start, pending = first, ""
        for number, line in enumerate(body.splitlines(), first):
            start = start if pending else number
            pending += line.removesuffix("\\") + " "
            if not line.endswith("\\"):
                argv = tuple(shlex.split(pending, comments=True))
                if argv:
                    commands.append(Command(str(page.relative_to(REPO)), start, argv))
                pending = ""
    return commands


def not_run_reason(command: Command) -> str | None:
    return next((reason for start, reason in NOT_RUN.items() if command.text.startswith(start)),
                None)


def runs_srl_jax(command: Command) -> bool:
    program, *args = command.argv
    return program == "./run.sh" or (program in PROGRAMS and args[:1] == ["-m"]
                                     and args[1].split(".")[0] == "srl_jax")


def typed(command: Command, cwd: Path) -> list[str]:
    """The command as the test types it (module docstring): PROGRAMS, DROPPED, STOP and
    PLACEHOLDERS applied."""
    program, *args = command.argv
    args = [placeheld(arg, cwd) for arg in args if arg not in DROPPED]
    if program == "./run.sh" and (not args or args[0].startswith("-")):
        args.insert(0, RUN_SH_EXPERIMENT)
    argv = PROGRAMS[program] + args
    return argv + STOP if argv[1:3] == ["-m", "srl_jax.launch"] else argv


def placeheld(arg: str, cwd: Path) -> str:
    def first_run(match: re.Match) -> str:
        runs = sorted((cwd / "runs" / match[1]).glob("*"))
        assert runs, f"no earlier command made a run under runs/{match[1]}/ for '{arg}'"
        return str(runs[0].relative_to(cwd))

    for placeholder in PLACEHOLDERS:
        arg = placeholder.sub(first_run, arg)
    return arg


def run(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run it to its end; a `--watch` redraws until Ctrl-C, which comes after its first
    screen. (exit code, output)."""
    with subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        if "--watch" in argv:
            first = process.stdout.readline()
            process.send_signal(signal.SIGINT)
            rest, _ = process.communicate(timeout=30)
            return process.returncode, first + rest
        try:
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            return -1, f"{output}\n(killed after {LAUNCH_TIMEOUT_S} s)"
        return process.returncode, output


def write_config_files(cwd: Path) -> None:
    """The yaml blocks that start with their path under configs/, written there."""
    written: dict[str, str] = {}
    for page, line, _, body in blocks("yaml"):
        if match := CONFIG_FILE.match(body):
            path = match[1]
            assert written.setdefault(path, body) == body, \
                f"{page.name}:{line} shows {path} unlike another page does"
            (cwd / path).parent.mkdir(parents=True, exist_ok=True)
            (cwd / path).write_text(body)


def test_every_documented_command_is_run_or_says_why_not() -> None:
    unclassified = [c.where() for c in documented_commands()
                    if not not_run_reason(c) and not runs_srl_jax(c)]
    assert not unclassified, ("commands of the docs the test neither runs nor lists in "
                              f"NOT_RUN with a reason: {unclassified}")


def test_every_exception_still_matches_a_documented_command() -> None:
    commands = documented_commands()
    stale = [start for start in NOT_RUN if not any(c.text.startswith(start) for c in commands)]
    stale += [arg for arg in DROPPED if not any(arg in c.argv for c in commands)]
    assert not stale, f"NOT_RUN or DROPPED entries that no documented command has: {stale}"


def test_blocks_without_a_language_hold_no_commands() -> None:
    """A command in an untagged block would go unrun: tag it bash (run) or text (a
    synopsis, not run)."""
    hidden = [f"{page.relative_to(REPO)}:{line}" for page, line, language, body in blocks()
              if not language and COMMAND_START.search(body)]
    assert not hidden, f"blocks with commands but no language: {hidden}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_documented_command_exits_0(tmp_path: Path) -> None:
    write_config_files(tmp_path)
    failures, seen, took = [], set(), []
    for command in documented_commands():
        if not_run_reason(command) or command.argv in seen:
            continue
        seen.add(command.argv)
        started = time.monotonic()
        argv = typed(command, tmp_path)
        code, output = run(argv, tmp_path)
        took.append(f"{time.monotonic() - started:5.1f} s  {command.text}")
        if code != 0:
            failures.append(f"{command.where()}\n  typed: {shlex.join(argv)}\n  exit {code}: "
                            f"{output[-2000:]}")
    assert not failures, "\n\n".join(failures) + "\n\ntimes:\n" + "\n".join(took)
