"""Markdown pieces the generated tables are made of: figures, median (min-max) cells,
tables and the line that says on what machine a result was measured."""

from __future__ import annotations

from typing import Any


def number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spread(summary: dict[str, float] | None, spec: str) -> str:
    if not summary:
        return "-"
    return (f"{format(summary['median'], spec)} ({format(summary['min'], spec)}-"
            f"{format(summary['max'], spec)})")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def hardware(m: dict[str, Any]) -> str:
    packages = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items()
                         if k in ("jax", "pyzmq", "gymnasium"))
    return (f"{m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, Python {m['python']}, "
            f"{packages}")


def machine_note(result: dict[str, Any]) -> str:
    return (f"*Measured {result['date']} on {hardware(result['machine'])}; "
            f"1-min load average at the start {result['machine']['load_avg_1m']}.*")
