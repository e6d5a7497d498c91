"""The locks' tie to pyproject.toml: a digest of its requirement tables, recorded in each lock.

A bound changed in pyproject.toml without a refreshed lock would leave run.sh and test.sh
installing what the lock says, silently; ensure_venv.sh and tests/test_lock.py compare the
digests and name the refresh command instead. Standard library only: it runs before any
virtual environment exists.

    python3 scripts/lockfile.py build-requires PYPROJECT   # [build-system] requires, one a line
    python3 scripts/lockfile.py stamp PYPROJECT LOCK       # record PYPROJECT's digest in LOCK
    python3 scripts/lockfile.py check PYPROJECT LOCK       # exit 1, one line, if LOCK is stale
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

DIGEST_PREFIX = "# pyproject.toml requirements digest: "
REFRESH = "scripts/lock.sh"


def requirement_tables(pyproject: Path) -> dict:
    """What a lock is resolved from: Python, the dependencies, the extras, the build backend."""
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    return {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "build-system": data["build-system"]["requires"],
    }


def digest(pyproject: Path) -> str:
    canonical = json.dumps(requirement_tables(pyproject), sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def recorded_digest(lock: Path) -> str | None:
    for line in lock.read_text().splitlines():
        if line.startswith(DIGEST_PREFIX):
            return line.removeprefix(DIGEST_PREFIX).strip()
    return None


def stamp(pyproject: Path, lock: Path) -> None:
    """Put PYPROJECT's digest on LOCK's first line (replacing an older one)."""
    lines = [line for line in lock.read_text().splitlines()
             if not line.startswith(DIGEST_PREFIX)]
    lock.write_text("\n".join([DIGEST_PREFIX + digest(pyproject), *lines]) + "\n")


def stale_reason(pyproject: Path, lock: Path) -> str | None:
    """Why LOCK does not match PYPROJECT's requirements, or None when it does."""
    if not lock.is_file():
        return f"{lock} is missing: create it with {REFRESH}"
    if recorded_digest(lock) != digest(pyproject):
        return (f"{lock} is stale: the requirements in {pyproject} changed since it was "
                f"locked; refresh it with {REFRESH}")
    return None


def main(argv: list[str]) -> int:
    command, pyproject, *rest = argv
    if command == "build-requires":
        print("\n".join(requirement_tables(Path(pyproject))["build-system"]))
    elif command == "stamp":
        stamp(Path(pyproject), Path(rest[0]))
    elif command == "check":
        reason = stale_reason(Path(pyproject), Path(rest[0]))
        if reason:
            print(reason, file=sys.stderr)
            return 1
    else:
        raise SystemExit(f"unknown command {command!r}: build-requires, stamp or check")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
