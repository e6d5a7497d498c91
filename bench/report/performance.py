"""The performance sections from `bench.peers.compare`'s results: each case's systems, the
srl_jax / peer ratios, the return windows, and the project's goals."""

from __future__ import annotations

from typing import Any

from bench.report.markdown import machine_note, number, spread, table

WINDOWS = (("last20", "last 20 episodes"), ("last100", "last 100 episodes"))
"""compare.py's return windows (the mean of the last N episodes), with their labels."""
RATIO_COLUMNS = (("fps_ratio", "frames/s ratio"), ("time_to_475_ratio", "time-to-{target} ratio"),
                 ("frames_to_475_ratio", "frames-to-{target} ratio"),
                 *((f"{kind}_to_475_{window}_ratio", f"{kind}-to-{{target}} ratio, {label}")
                   for window, label in WINDOWS for kind in ("time", "frames")))
"""compare.py's srl_jax / peer ratios, in table order, with their column headings."""


def target_tables(result: dict[str, Any], title: str) -> list[str]:
    """A to-the-target case of compare.py: each system's figures, then the srl_jax / peer
    ratios the results hold (every system but srl_jax is a peer)."""
    target, rounds = result["target_return"], result["rounds"]
    systems = result["systems"]
    rows = [[name, spread(s["fps"], ",.0f"), spread(s["startup_s"], ".1f"),
             spread(s["time_to_target_s"], ".1f"), spread(s["frames_to_target"], ",.0f"),
             f"{s['solved']}/{rounds}"] for name, s in systems.items()]
    lines = [f"**{title}**, {rounds} rounds, median (min-max):", ""]
    lines += table(["system", "env frames/s", "start-up s", f"time to {target:g} s",
                     f"frames to {target:g}", "solved"], rows)
    ratios, peers = result["ratios"], [name for name in systems if name != "srl_jax"]
    columns = [(key, heading.format(target=f"{target:g}")) for key, heading in RATIO_COLUMNS
               if any(f"{key}_vs_{peer}" in ratios for peer in peers)]
    lines += ["", "srl_jax / peer, round by round, median (min-max):", ""]
    lines += table(["peer", *(heading for _, heading in columns)], [
        [peer, *(spread(ratios.get(f"{key}_vs_{peer}"), ".2f") for key, _ in columns)]
        for peer in peers])
    return [*lines, *windowtable(result)]


def windowtable(result: dict[str, Any]) -> list[str]:
    """Each system's time and frames to the target by the mean of its last N episodes,
    for the windows the results hold (none before compare.py recorded them)."""
    target, systems = result["target_return"], result["systems"]
    windows = [(window, label) for window, label in WINDOWS
               if any(f"time_to_target_{window}_s" in s for s in systems.values())]
    if not windows:
        return []
    header = ["system", *(f"{kind} to {target:g}, {label}" for _, label in windows
                          for kind in ("time (s)", "frames"))]
    rows = [[name, *(cell for window, _ in windows for cell in (
        spread(s.get(f"time_to_target_{window}_s"), ".1f"),
        spread(s.get(f"frames_to_target_{window}"), ",.0f")))] for name, s in systems.items()]
    return ["", "By the mean return of the last N episodes, the same window on every side "
            "(srl_jax's metrics rows and the baseline's lines carry "
            "`episode_return_mean_last20` and `_last100`, from every episode's return; "
            "Sample Factory reports its last 100 episodes' mean), over the runs that got "
            f"there (`-`: none did within {result['budget_s']:g} s):", "", *table(header, rows)]


def cartpole(result: dict[str, Any]) -> list[str]:
    lines = target_tables(result, f"CartPole-v1 to a return of {result['target_return']:g}")
    return [*lines, "", "The return each system reports per row, which the time and frames "
            "to 475 of the first table are read by: srl_jax and the single-process baseline "
            f"(`cleanrl_ppo`) the mean of the episodes that ended within a "
            f"{result.get('row_interval_s', 1.0):g} s row, Sample Factory the mean of its "
            "last 100 episodes.", "", *cartpole_goals(result), "",
            machine_note(result)]


def dqn(result: dict[str, Any]) -> list[str]:
    target = result["target_return"]
    lines = target_tables(result, f"CartPole-v1 DQN to an evaluation return of {target:g}")
    return [*lines, "", "srl_jax `cartpole_dqn` (Ape-X DQN: an actor acting with its own "
            "network copy, a replay server, the learner and an evaluator, each a process) against "
            "`python -m bench.peers.cleanrl_dqn` (one process, the same config, network and "
            "update). The return is each side's greedy evaluation (`eval_return_mean`); times "
            "count from launch.", "", machine_note(result)]


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def cartpole_goals(result: dict[str, Any]) -> list[str]:
    """The project's goals for this case, and whether the medians reach them; a time goal
    is judged with the same return window on both sides where the results hold one."""
    fps_sf = result.get("fps_ratio_vs_sample_factory")
    time_sf = result.get("time_to_475_ratio_vs_sample_factory")
    time_sf_100 = result.get("time_to_475_last100_ratio_vs_sample_factory")
    time_clean = result.get("time_to_475_ratio_vs_cleanrl_ppo")
    time_clean_20 = result.get("time_to_475_last20_ratio_vs_cleanrl_ppo")
    lines = ["Goals (medians of the round-by-round ratios):", ""]
    if fps_sf is not None:
        lines.append(f"- at least 3x Sample Factory's frames/s: {fps_sf:.2f}x, {_met(fps_sf >= 3)}")
    if time_sf is not None:
        lines.append(f"- at most 1/3 of Sample Factory's time to 475 (each side's own "
                     f"return): {time_sf:.2f}, {_met(time_sf <= 1 / 3)}")
    if time_sf_100 is not None:
        lines.append(f"- at most 1/3 of Sample Factory's time to 475, the mean of the last "
                     f"100 episodes on both sides: {time_sf_100:.2f}, "
                     f"{_met(time_sf_100 <= 1 / 3)}")
    if time_clean is not None:
        lines.append(f"- a shorter time to 475 than the single-process baseline "
                     f"({result.get('row_interval_s', 1.0):g} s row means): {time_clean:.2f}, "
                     f"{_met(time_clean < 1)}")
    if time_clean_20 is not None:
        lines.append(f"- at most half of the single-process baseline's time to 475, the mean "
                     f"of the last 20 episodes on both sides: {time_clean_20:.2f}, "
                     f"{_met(time_clean_20 <= 1 / 2)}")
    return lines


FINAL_LABELS = {"episode_return_mean_last100": "return, last 100 episodes",
                "win_rate_last100": "win rate, last 100 episodes"}
"""compare.py's final figures of a run to equal frames (`final_<key>`), with their labels."""


def equal_frames_tables(result: dict[str, Any], title: str, note: str = "") -> list[str]:
    """A to-equal-frames case of compare.py: each system's speed, time to the frames and
    final figures there, then the srl_jax / baseline ratios, and how they ran (`note`:
    what the case adds to that)."""
    frames, rounds, peer = result["frames"], result["rounds"], result["baseline"]
    finals = [(key, FINAL_LABELS.get(key, key)) for key in result["final_keys"]]
    rows = [[name, spread(s["fps"], ",.0f"), spread(s["startup_s"], ".1f"),
             spread(s["time_to_frames_s"], ".0f"),
             *(spread(s[f"final_{key}"], ".2f") for key, _ in finals),
             f"{s['reached']}/{rounds}"] for name, s in result["systems"].items()]
    lines = [f"**{title} to {frames:,} env steps**, {rounds} rounds, median (min-max):", ""]
    lines += table(["system", "env frames/s", "start-up s", "time to the frames s",
                    *(label for _, label in finals), "reached"], rows)
    ratios = result["ratios"]
    columns = [("fps", "frames/s ratio"), ("time_to_frames", "time-to-frames ratio"),
               *((f"final_{key}", f"{label} ratio") for key, label in finals)]
    lines += ["", "srl_jax / baseline, round by round, median (min-max):", ""]
    lines += table(["baseline", *(heading for _, heading in columns)], [
        [peer, *(spread(ratios.get(f"{key}_ratio_vs_{peer}"), ".2f") for key, _ in columns)]])
    config = result["srl_jax_config"]
    return [*lines, "", f"srl_jax `{config['experiment']}` as shipped (its step size annealed "
            f"over its own `stop.env_frames`), stopped by the harness at the frames; "
            f"`python -m bench.peers.{peer}` (one process, one jitted program) with "
            f"{' '.join(f'`{o}`' for o in result['baseline_options'])}, stopping itself at "
            f"the last whole update before them. Times count from launch (start-up "
            f"included); each run's budget {result['budget_s']:g} s (`reached`: the runs "
            f"that got to the frames within it; the figures of the others are at the "
            f"frames they reached).{note}", "", machine_note(result)]


def minatar(result: dict[str, Any]) -> list[str]:
    return equal_frames_tables(result, "MinAtar Breakout PPO")


def smax(result: dict[str, Any]) -> list[str]:
    return equal_frames_tables(result, "SMAX 3m MAPPO", " An env step is one joint step of "
                               "the 3 marines, and the return one marine's (SMAX gives each "
                               "the team's reward), on both sides.")


def sampling(result: dict[str, Any]) -> list[str]:
    raw = result["raw_env_steps_per_s"]
    cores = result["machine"]["cores"]
    rows = [[name, spread(s["fps"], ",.0f"),
             number(s["fps"]["median"] / raw if s["fps"] else None, ".2f")]
            for name, s in result["systems"].items()]
    rows.append([f"raw env stepping ({cores} processes)", f"{raw:,.0f}", "1.00"])
    lines = [f"**CartPole-v1 sampling, learning negligible**, {result['seconds']:g} s runs, "
             f"{result['rounds']} rounds:", ""]
    lines += table(["system", "env frames/s", "/ raw stepping"], rows)
    sizes = result["srl_jax_config"]["overrides"][len(result["srl_jax_default_sizes_config"]
                                                        ["overrides"]):]
    lines += ["", f"Sampling efficiency (srl_jax / raw stepping): "
              f"{number(result['sampling_efficiency'], '.2f')} with {', '.join(sizes)} "
              f"(`srl_jax`), {number(result['sampling_efficiency_default_sizes'], '.2f')} "
              f"at the default experiment's sizes; srl_jax at the default sizes / Sample "
              f"Factory at its documented CartPole settings: "
              f"{spread(result['ratios']['fps_ratio_vs_sample_factory'], '.2f')}. "
              f"Goal: an efficiency of at least 0.5, "
              f"{_met((result['sampling_efficiency'] or 0) >= 0.5)}.",
              "", machine_note(result)]
    return lines


def pong(result: dict[str, Any]) -> list[str]:
    raw, ours = result["raw_env_steps_per_s"], result["systems"]["srl_jax"]["fps"]
    cores = result["machine"]["cores"]
    lines = [f"**ALE Pong-v5 sampling through remote batched inference (Nature-CNN)**, "
             f"{result['seconds']:g} s runs, {result['rounds']} rounds (agent steps/s; each "
             f"is 4 emulator frames):", ""]
    lines += table(["system", "steps/s", "/ raw stepping"], [
        ["srl_jax", spread(ours, ",.0f"), number(result["sampling_efficiency"], ".2f")],
        [f"raw ALE stepping ({cores} processes)", f"{raw:,.0f}", "1.00"]])
    return [*lines, "", machine_note(result)]
