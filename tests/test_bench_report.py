"""The README's performance tables are what the benchmarks' results files say."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_readme_performance_tables_match_the_results_files() -> None:
    check = subprocess.run([sys.executable, str(REPO / "bench" / "report.py"), "--check"],
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
    assert set(measured) == shipped, "run bench/configs.py for the new config"
    for name, entry in measured.items():
        assert entry["runs"] and entry["random_episodes"] > 0, name
        assert entry["machine"]["cores"] >= 1, name


def test_a_config_changed_after_its_figures_were_measured_fails_the_check(
        tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from bench.machine import config_hash
    from bench.report import stale_configs

    entries = {"cartpole_ppo": {"config_sha256": config_hash("cartpole_ppo"), "commit": "a"},
               "pendulum_ppo": {"config_sha256": "0" * 16, "commit": "b"},
               "cartpole_dqn": {"commit": "c"}}  # measured before hashes: not checked
    (tmp_path / "configs.json").write_text(json.dumps({"configs": entries}))
    assert stale_configs(tmp_path) == [
        "configs/pendulum_ppo.yaml changed after its figures were measured at commit b: "
        "rerun bench/configs.py pendulum_ppo"]
