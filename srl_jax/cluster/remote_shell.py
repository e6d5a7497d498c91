"""Command lines for other hosts (run over ssh or srun by the cluster scripts).

Each function returns one complete, quoted line for the remote host's shell, so the
dry run shows exactly what runs there. Paths are shell words (`home_path` makes one
under the remote login directory), since `$HOME` is only known over there. A remote
line never relies on the user's shell profile: interpreters are absolute paths, and
the rest are coreutils (`setsid`, `kill`, `tail`).
"""

from __future__ import annotations

import shlex

MIN_PYTHON = (3, 12)
"""The project's `requires-python` floor, checked on every host before anything runs."""


def home_path(path: str) -> str:
    """`path` as a shell word: relative paths are under the remote `$HOME`."""
    if path.startswith("/"):
        return shlex.quote(path)
    return '"$HOME"/' + shlex.quote(path)


def python_check(python: str, imports: tuple[str, ...] = ()) -> str:
    """Exit 1 with one line unless `python` (a shell word) is a Python new enough for
    srl_jax (and, where given, imports `imports`): a wrong interpreter fails here, not
    in a remote log minutes later."""
    need = ".".join(map(str, MIN_PYTHON))
    code = (f"import sys; v = sys.version_info; v >= {MIN_PYTHON!r} or sys.exit("
            f"f'{{sys.executable}} is Python {{v[0]}}.{{v[1]}}; srl_jax needs {need}+')"
            + "".join(f"; import {module}" for module in imports))
    return f"{python} -c {shlex.quote(code)}"


def detached(argv: list[str], log: str, pid_file: str, env: dict[str, str] | None = None
             ) -> str:
    """Start `argv` (shell words) in a session of its own with no tie to the caller's
    stdin, stdout or stderr, so the ssh or srun that runs this line returns at once; its
    pid goes to `pid_file`. `$!` is that process itself: the command is a simple one
    (no subshell), and `setsid` execs it (without job control the child is no group
    leader, so `setsid` need not fork). It leads its own process group, which
    `stop_group` ends."""
    assignments = [f"{k}={v}" for k, v in (env or {}).items()]
    command = " ".join(["setsid", *(["env", *assignments] if assignments else []), *argv])
    return f"set +m; {command} > {log} 2>&1 < /dev/null & echo $! > {pid_file}"


def stop_group(pid_file: str, grace_s: int = 10) -> str:
    """End the process group that `detached` started (SIGTERM, then SIGKILL after
    `grace_s`); nothing to do without a pid file."""
    return (f'pid=$(cat {pid_file} 2>/dev/null) || exit 0; kill -TERM -- "-$pid" 2>/dev/null; '
            f'i=0; while kill -0 -- "-$pid" 2>/dev/null && [ "$i" -lt {2 * grace_s} ]; '
            'do sleep 0.5; i=$((i + 1)); done; '
            f'kill -KILL -- "-$pid" 2>/dev/null; rm -f {pid_file}; true')


def log_tail(log: str, lines: int = 30) -> str:
    """The last lines of a remote log, for the workstation's error output."""
    return f"tail -n {lines} {log} 2>/dev/null || echo '(no log at '{log}')'"
