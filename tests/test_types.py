"""The packages type-check clean under mypy, as `[tool.mypy]` in pyproject.toml sets it.

A test rather than a step of ./test.sh before the suite: a check on a cold cache takes
about 20 s of CPU, which here fills a gap at the end of one of the suite's two workers
instead of adding to its wall time (the cache, the user's by `cache_dir`, makes a rerun take
a second, a fresh clone's included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_packages_type_check_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout
