"""The README's performance tables are what the benchmarks' results files say."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_readme_performance_tables_match_the_results_files() -> None:
    check = subprocess.run([sys.executable, "-m", "bench.report", "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr


def test_every_results_file_names_its_machine_and_the_fps_ratio_is_there() -> None:
    results = {path.stem: json.loads(path.read_text())
               for path in (REPO / "bench" / "results").glob("*.json")}
    assert {"compare_cartpole", "compare_sampling", "scale"} <= set(results)
    for name, result in results.items():
        assert result["machine"]["cores"] >= 1 and result["machine"]["cpu"], name
    cartpole = results["compare_cartpole"]
    assert any("fps" in key and "ratio" in key and isinstance(value, float)
               for key, value in cartpole.items())
    assert cartpole["fps_ratio_vs_sample_factory"] > 0
    assert results["scale"]["per_request_overhead_us"] > 0
    assert results["scale"]["per_sample_overhead_us"] > 0


def test_every_shipped_config_has_measured_figures() -> None:
    measured = json.loads((REPO / "bench" / "results" / "configs.json").read_text())["configs"]
    shipped = {path.stem for path in (REPO / "configs").glob("*.yaml")}
    assert set(measured) == shipped, "run python -m bench.configs for the new config"
    for name, entry in measured.items():
        assert entry["runs"] and entry["random_episodes"] > 0, name
        assert entry["machine"]["cores"] >= 1, name


def test_a_config_changed_after_its_figures_were_measured_fails_the_check(tmp_path) -> None:
    from bench.harness.machine import config_hash
    from bench.report.experiments import stale_configs

    entries = {"cartpole_ppo": {"config_sha256": config_hash("cartpole_ppo"), "commit": "a"},
               "pendulum_ppo": {"config_sha256": "0" * 16, "commit": "b"},
               "cartpole_dqn": {"commit": "c"}}  # measured before hashes: not checked
    (tmp_path / "configs.json").write_text(json.dumps({"configs": entries}))
    assert stale_configs(tmp_path) == [
        "configs/pendulum_ppo.yaml changed after its figures were measured at commit b: "
        "rerun python -m bench.configs pendulum_ppo"]


MACHINE = {"cores": 2, "cpu": "test CPU", "memory_gib": 8.0, "python": "3.11", "packages": {},
           "load_avg_1m": 0.5}


def spread(median: float) -> dict[str, float]:
    return {"median": median, "min": median, "max": median, "n": 1}


def cartpole_result(windows: bool) -> dict:
    """bench.peers.compare's cartpole results for one round; `windows`: with the return windows."""
    def system(time_s: float, **extra: dict[str, float]) -> dict:
        return {"fps": spread(1000.0), "startup_s": spread(5.0), "time_to_target_s":
                spread(time_s), "frames_to_target": spread(100_000.0), "solved": 1, **extra}

    ours = {"time_to_target_last20_s": spread(12.0), "frames_to_target_last20": spread(9e4),
            "time_to_target_last100_s": spread(14.0), "frames_to_target_last100": spread(1.1e5)}
    peer = {"time_to_target_last100_s": spread(60.0), "frames_to_target_last100": spread(3e5)}
    baseline = {"time_to_target_last20_s": spread(30.0), "frames_to_target_last20": spread(2e5),
                "time_to_target_last100_s": None, "frames_to_target_last100": None}
    ratios = {"time_to_475_ratio_vs_cleanrl_ppo": spread(0.6)}
    if windows:
        ratios |= {"time_to_475_last20_ratio_vs_cleanrl_ppo": spread(0.4),
                   "time_to_475_last100_ratio_vs_sample_factory": spread(0.23)}
    return {"target_return": 475.0, "rounds": 1, "budget_s": 180.0, "date": "today",
            "machine": MACHINE, "ratios": ratios,
            **{key: value["median"] for key, value in ratios.items()},
            "systems": {"srl_jax": system(13.0, **ours if windows else {}),
                        "sample_factory": system(60.0, **peer if windows else {}),
                        "cleanrl_ppo": system(22.0, **baseline if windows else {})}}


def test_cartpole_renders_each_return_window_and_judges_time_goals_by_the_same_window() -> None:
    from bench.report.performance import cartpole

    text = "\n".join(cartpole(cartpole_result(windows=True)))
    assert ("| srl_jax | 12.0 (12.0-12.0) | 90,000 (90,000-90,000) | 14.0 (14.0-14.0) | "
            "110,000 (110,000-110,000) |") in text
    assert "| cleanrl_ppo | 30.0 (30.0-30.0) | 200,000 (200,000-200,000) | - | - |" in text
    assert ("at most half of the single-process baseline's time to 475, the mean of the last "
            "20 episodes on both sides: 0.40, met") in text
    assert ("at most 1/3 of Sample Factory's time to 475, the mean of the last 100 episodes "
            "on both sides: 0.23, met") in text
    assert "time-to-475 ratio, last 20 episodes" in text
    before = "\n".join(cartpole(cartpole_result(windows=False)))  # results from before windows
    assert "last 20 episodes" not in before and "1 s row means): 0.60, met" in before


def test_an_equal_frames_case_renders_each_side_its_final_figures_and_the_ratios() -> None:
    from bench.report.performance import smax
    from bench.report.readme import SECTIONS

    def system(fps: float, win_rate: float | None, reached: int) -> dict:
        return {"fps": spread(fps), "startup_s": spread(9.0), "time_to_frames_s": spread(600.0),
                "frames": spread(1e6), "final_win_rate_last100":
                spread(win_rate) if win_rate is not None else None,
                "final_episode_return_mean_last100": spread(1.5), "reached": reached}

    ratios = {"fps_ratio_vs_jaxmarl_mappo": spread(0.5),
              "final_win_rate_last100_ratio_vs_jaxmarl_mappo": spread(1.25)}
    result = {"frames": 1_000_000, "rounds": 3, "budget_s": 1200.0, "baseline": "jaxmarl_mappo",
              "final_keys": ["win_rate_last100", "episode_return_mean_last100"],
              "baseline_options": ["--no-anneal-lr"], "ratios": ratios, "date": "today",
              "machine": MACHINE, "srl_jax_config": {"experiment": "smax_3m_mappo"},
              "systems": {"srl_jax": system(1000.0, 0.95, 3),
                          "jaxmarl_mappo": system(2000.0, None, 2)}}
    text = "\n".join(smax(result))
    assert "**SMAX 3m MAPPO to 1,000,000 env steps**, 3 rounds" in text
    assert "| srl_jax | 1,000 (1,000-1,000) | 9.0 (9.0-9.0) | 600 (600-600) | " \
        "0.95 (0.95-0.95) | 1.50 (1.50-1.50) | 3/3 |" in text
    assert "| jaxmarl_mappo | 2,000 (2,000-2,000) | 9.0 (9.0-9.0) | 600 (600-600) | - |" in text
    assert "| jaxmarl_mappo | 0.50 (0.50-0.50) | - | 1.25 (1.25-1.25) | - |" in text
    assert "win rate, last 100 episodes ratio" in text and "`--no-anneal-lr`" in text
    assert SECTIONS["compare_smax"] is smax and "compare_minatar" in SECTIONS


def test_the_scale_projection_takes_the_atari_step_cost_from_the_pong_results() -> None:
    from bench.report.scaling import atari_step_us, scale

    pong = {"raw_env_steps_per_s": 2000.0, "date": "today",
            "machine": {**MACHINE, "cores": 4}}
    assert atari_step_us(pong) == 2000.0  # 4 cores x 1e6 / 2,000 steps/s
    result = json.loads((REPO / "bench" / "results" / "scale.json").read_text())
    text = "\n".join(scale(result, pong))
    assert "Atari env step of 2000 us of a core" in text and "500 us" not in text
    assert "No Atari step cost measured yet" in "\n".join(scale(result))


def test_config_hash_takes_a_shipped_name_or_a_path() -> None:
    from bench.harness.machine import config_hash

    assert config_hash("cartpole_ppo") == config_hash(REPO / "configs" / "cartpole_ppo.yaml")


def test_the_scale_text_names_the_bare_pyzmq_floor_where_it_was_measured() -> None:
    from bench.report.scaling import zmq_floor

    assert zmq_floor({"per_request_overhead_us": 70.0}) == ""
    text = zmq_floor({"per_request_zmq_floor_us": 36.4, "per_request_zmq_floor_ipc_us": 33.6})
    assert "36 us over TCP" in text and "34 us over ipc://" in text


def test_with_seeds_run_k_launches_with_the_configs_seed_plus_k(tmp_path, monkeypatch) -> None:
    from bench import configs

    commands: list[list[str]] = []
    monkeypatch.setattr(configs, "run_launcher",
                        lambda command, *_: commands.append(command) or 0)
    figures = {"first_return": -2.0, "final_return": -1.0, "max_return": -1.0, "time_s": 1.0,
               "env_frames": 10, "stop_reason": "wall time"}
    monkeypatch.setattr(configs, "run_figures", lambda run_dir, *_: dict(figures))
    shipped_seed = configs.shipped("mpe_spread_ppo").seed
    for seeds in (False, True):
        args = configs.parse_args(["mpe_spread_ppo", "--runs", "2", "--max-minutes", "1"]
                                  + (["--seeds"] if seeds else []))
        runs = [configs.train_once("mpe_spread_ppo", k, args, tmp_path)[0] for k in range(2)]
        assert [run["seed"] for run in runs] == \
            [shipped_seed, shipped_seed + 1 if seeds else shipped_seed]
    seeds_set = [[c for c in command if c.startswith("seed=")] for command in commands]
    assert seeds_set == [[], [], [f"seed={shipped_seed}"], [f"seed={shipped_seed + 1}"]]


def test_hold_takes_the_n_rows_of_the_target_metric_after_its_first_reach() -> None:
    from bench.configs import held_values

    rows = [{"episode_return_mean": 100.0}, {"eval_return_mean": 470.0},
            {"eval_return_mean": 480.0, "episode_return_mean": 200.0},
            {"episode_return_mean": 300.0}, {"eval_return_mean": 460.0},
            {"eval_return_mean": float("nan")}, {"eval_return_mean": 500.0},
            {"eval_return_mean": 490.0}]
    assert held_values(rows, "eval_return_mean", 475, 2) == [460.0, 500.0]
    assert held_values(rows, "eval_return_mean", 475, 5) == [460.0, 500.0, 490.0]  # so far
    assert held_values(rows, "eval_return_mean", 490, 1) == [490.0]  # after the 500
    assert held_values(rows, "eval_return_mean", 600, 2) is None
    assert held_values(rows, "episode_return_mean", 200, 1) == [300.0]


def test_with_hold_a_run_goes_past_its_target_and_says_the_bench_stopped_it(
        tmp_path, monkeypatch) -> None:
    from bench import configs

    launched = []

    def launcher(command, run_dir, log, limit, stop_when=None) -> int:
        """The run writes its evaluations; the bench's watch says when it has held."""
        launched.append(command)
        run_dir.mkdir()
        for value in (400.0, 480.0, 490.0, 500.0, 470.0):
            assert not stop_when(), "not before 3 evaluations followed the first 475"
            with (run_dir / "metrics.jsonl").open("a") as metrics:
                metrics.write(json.dumps({"time": 1.0, "eval_return_mean": value}) + "\n")
        assert stop_when()
        return 130  # SIGINT's

    monkeypatch.setattr(configs, "run_launcher", launcher)
    monkeypatch.setattr(configs, "run_figures", lambda run_dir, target, hold: {
        "first_return": 20.0, "final_return": 480.0, "max_return": 500.0, "time_s": 90.0,
        "env_frames": 10, "stop_reason": "interrupted by SIGINT", "time_to_target_s": 80.0,
        "held": {"after": hold, "values": [480.0] * hold, "mean": 480.0, "min": 480.0}})
    args = configs.parse_args(["cartpole_dqn", "--hold", "3", "--max-minutes", "1"])
    figures, overrides = configs.train_once("cartpole_dqn", 0, args, tmp_path)
    assert overrides == ["stop.wall_time_s=60", "stop.target_eval_return=null"]
    assert "stop.target_eval_return=null" in launched[0]
    assert figures["stop_reason"].startswith("stopped by bench.configs 3 rows")
