"""The published anchors interpolate within their curves only, and the published-results
table renders our runs beside them from a configs.json-shaped result."""

from __future__ import annotations

import pytest

from bench.peers.published import PUBLISHED, WIN_RATE, Anchor
from bench.report.published import final_of, published

CURVE = Anchor("paper", "ref", "return", ((1e6, 10.0), (3e6, 20.0)), "by eye")


def test_an_anchor_interpolates_linearly_in_steps_and_says_nothing_outside() -> None:
    assert CURVE.at(1e6) == 10.0 and CURVE.at(3e6) == 20.0
    assert CURVE.at(2e6) == pytest.approx(15.0)
    assert CURVE.at(0.5e6) is None and CURVE.at(3.5e6) is None
    assert CURVE.at(3.02e6) == 20.0, "a run that stops a chunk past the last point reads it"
    final = Anchor("paper", "ref", "win rate", ((1e7, 1.0),), "copied")
    assert final.at(1e7) == 1.0 and final.at(2e6) is None


def test_every_anchor_is_a_sourced_curve_with_increasing_steps() -> None:
    for held in PUBLISHED.values():
        assert held.anchors or held.note  # an unanchored config says why
        for anchor in held.anchors:
            steps = [x for x, _ in anchor.points]
            assert steps == sorted(steps) and len(set(steps)) == len(steps)
            assert anchor.reference and anchor.definition and anchor.read


def _run(frames: int, final: float, **extra: float) -> dict:
    return {"target_metric": "episode_return_mean", "final_return": final,
            "env_frames": frames, "time_s": 600.0, **extra}


def _entry(runs: list[dict]) -> dict:
    return {"runs": runs, "machine": {"cores": 2}}


def test_the_table_holds_our_median_beside_the_published_value_at_our_steps() -> None:
    result = {"configs": {
        "minatar_breakout_ppo": _entry([_run(2_000_000, 20.0), _run(2_000_000, 30.0),
                                        _run(2_000_000, 25.0)]),
        "minatar_breakout_dqn": _entry([_run(6_000_000, 3.0, final_eval_return_mean=9.0)]),
        "smax_3m_mappo": _entry([_run(500_000, -1.0, final_win_rate=0.95)]),
        "smax_2s3z_mappo": _entry([_run(2_000_000, 0.0)]),  # its win rate not recorded
        "cartpole_ppo": _entry([_run(1_000, 500.0)])}}      # no anchor: left out
    lines = published(result)
    text = "\n".join(lines)
    breakout = next(line for line in lines if line.startswith("| `minatar_breakout_ppo`"))
    assert "25.0 (20.0-30.0)" in breakout and "2.00M" in breakout
    assert f"{PUBLISHED['minatar_breakout_ppo'].anchors[0].at(2e6):,.1f} (PureJaxRL PPO)" \
        in breakout
    smax = next(line for line in lines if line.startswith("| `smax_3m_mappo`"))
    assert "`win_rate`" in smax and "0.95" in smax and "-1.0" not in smax
    two = next(line for line in lines if line.startswith("| `smax_2s3z_mappo`"))
    assert "no `win_rate` recorded" in two
    assert "1.00 at 10M only" in two and "0.59 (JaxMARL IPPO sweep)" in two
    dqn = next(line for line in lines if line.startswith("| `minatar_breakout_dqn`"))
    assert "| 9.0 |" in dqn and "beyond the published curve (MinAtar paper DQN: 0.1-5M)" in dqn
    assert "cartpole_ppo" not in text and "wall time on 2 cores" in text
    assert "the issue's 0.9" in text  # an unanchored config's note is in the sources


def test_a_run_measured_by_another_metric_reads_its_final_key() -> None:
    run = _run(1, 5.0, final_win_rate=0.5)
    assert final_of(run, "episode_return_mean") == 5.0 and final_of(run, WIN_RATE) == 0.5
    assert final_of(run, "eval_return_mean") is None


def test_no_anchored_results_say_so() -> None:
    assert "No config with a published anchor" in published({"configs": {}})[0]
