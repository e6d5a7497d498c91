"""A 48-second soak (`python -m bench.soak`): no process's memory or open files grow after
its 21-second warm-up (startup and compiles), the lowest of the first 12 s after it against
the lowest of the last 12 s. Its envs are paced (0.2 ms a step), so every worker goes
through its loop, its saves and its heartbeats as in the 30-minute benchmark, on under
half the CPU of the suite's two cores."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.soak import Track, growth
from tests.conftest import REPO
from tests.paced_env import PACED_ID


def test_growth_reads_floors_so_a_save_in_flight_is_no_leak():
    """At a 5 s checkpoint interval a sample often lands on a save holding files open."""
    steady = Track(samples=[(t, 300.0, 17) for t in range(0, 200, 5)])
    steady.samples[-1] = (195, 304.0, 28)
    assert growth(steady, warmup_s=60, window_s=30) == (300.0, 300.0, 17, 17)
    leaking = Track(samples=[(t, 300.0 + t / 10, 17 + t // 50) for t in range(0, 200, 5)])
    assert growth(leaking, warmup_s=60, window_s=30) == (306.0, 316.5, 18, 20)


@pytest.mark.slow
def test_short_soak_keeps_memory_and_files_flat():
    result = subprocess.run([sys.executable, "-m", "bench.soak", "--minutes", "0.8",
                             "--warmup-minutes", "0.35", "--window", "12", "--every", "2",
                             "--set", f"env.id=tests.paced_env:{PACED_ID}"],
                            cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.splitlines()
    for name in ("controller", "learner-0", "inference-0", "actor-0", "actor-1"):
        assert any(line.startswith(name) for line in table), result.stdout
    assert "no process grew more than 5% after warm-up" in result.stdout
