"""The experiments table: what each shipped config reached, in what time, against the
random policy (from `bench.configs`' results), and which configs changed since."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.harness.machine import CONFIGS_DIR, DEFAULT_EXPERIMENT, RESULTS_DIR, config_hash
from bench.report.markdown import hardware, table


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def _over(runs: list[dict[str, Any]], key: str, spec: str) -> str:
    """Median of `key` over the runs, with the range when there were several."""
    values = [run[key] for run in runs]
    if len(values) == 1:
        return format(values[0], spec)
    return (f"{format(statistics.median(values), spec)} ({format(min(values), spec)} to "
            f"{format(max(values), spec)})")


def _held(entry: dict[str, Any]) -> str:
    """What the rows after the target said, for runs measured with `bench.configs --hold`."""
    values = [value for run in entry["runs"] for value in (run.get("held") or {}).get("values", [])]
    if not values:
        return ""
    return (f"; the {entry['hold']} rows after it: mean {statistics.fmean(values):,.1f}, "
            f"min {min(values):,.1f}")


def experiment_row(name: str, entry: dict[str, Any]) -> list[str]:
    """One config's row: what it reached, in what time, against the random policy."""
    from bench.configs import describe_config, shipped  # imports the runtime and gymnasium

    described = describe_config(shipped(name))
    runs = entry["runs"]
    solved = [run for run in runs if run["time_to_target_s"] is not None]
    if solved and len(solved) == len(runs):
        measure = ("evaluation return" if runs[0].get("target_metric") == "eval_return_mean"
                   else "return")
        reached = f"{measure} {runs[0]['target']:g} (its target)" + _held(entry)
        took = (f"{_over(runs, 'time_to_target_s', '.0f')} s, "
                f"{_median(runs, 'frames_to_target') / 1e3:,.0f}k frames")
    else:
        reached = (f"return {_over(runs, 'final_return', ',.1f')} (best row "
                   f"{_median(runs, 'max_return'):,.1f})")
        timed_out = all("wall time" in (run["stop_reason"] or "") for run in runs)
        capped = any(o.startswith("stop.wall_time_s=") for o in entry["overrides"])
        why = ("the benchmark's cap" if timed_out and capped else
               "its time limit" if timed_out else "its frame limit")
        took = (f"{_over(runs, 'time_s', '.0f')} s ({why}), "
                f"{_median(runs, 'env_frames') / 1e3:,.0f}k frames, "
                f"{_median(runs, 'learner_steps'):,.0f} updates")
        if len(solved) not in (0, len(runs)):
            took += f"; {len(solved)}/{len(runs)} runs reached {runs[0]['target']:g}"
    label = f"`{name}`" + (" (default)" if name == DEFAULT_EXPERIMENT else "")
    return [label, described["what"], described["needs"] or "-", reached, took,
            f"{_over(runs, 'first_return', ',.1f')}",
            f"{entry['random_return_mean']:,.1f} ({entry['random_episodes']} episodes)",
            str(len(runs))]


def experiments(result: dict[str, Any]) -> list[str]:
    entries = result["configs"]
    lines = table(["config", "what", "needs", "reached (final: mean of the last 10 rows)",
                    "in", "first rows", "random policy", "runs"],
                   [experiment_row(name, entry) for name, entry in entries.items()])
    return [*lines, "", measured_on(list(entries.values()))]


def measured_on(entries: list[dict[str, Any]]) -> str:
    """One line for results measured one config at a time: the dates, the machine(s) and
    how busy it was at each start."""
    dates = sorted(entry["date"] for entry in entries)
    machines = sorted({hardware(entry["machine"]) for entry in entries})
    loads = [entry["machine"]["load_avg_1m"] for entry in entries]
    return (f"*Measured from {dates[0]} to {dates[-1]}, one config at a time (or, for a "
            f"comparison, one run of each in turn: `--interleave`), on "
            f"{' / '.join(machines)}; 1-min load average at the starts {min(loads)} to "
            f"{max(loads)}.*")


def stale_configs(results_dir: Path = RESULTS_DIR) -> list[str]:
    """Shipped configs whose file changed after `python -m bench.configs` measured them (by the
    hash it recorded; entries measured before hashes were recorded are not checked)."""
    path = results_dir / "configs.json"
    entries = json.loads(path.read_text())["configs"] if path.exists() else {}
    return [f"configs/{name}.yaml changed after its figures were measured at commit "
            f"{entry.get('commit', '?')}: rerun python -m bench.configs {name}"
            for name, entry in sorted(entries.items())
            if "config_sha256" in entry and (CONFIGS_DIR / f"{name}.yaml").exists()
            and entry["config_sha256"] != config_hash(name)]
