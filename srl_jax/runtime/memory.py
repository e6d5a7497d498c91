"""Resident memory of a process, as the kernel reports it (Linux; None elsewhere)."""

from __future__ import annotations

from pathlib import Path


def resident_mib(pid: int | str = "self") -> float | None:
    """VmRSS of process `pid` in MiB; None where it cannot be read (gone, or not Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None
