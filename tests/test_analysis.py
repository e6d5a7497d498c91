"""srl_jax.analysis on hand-written run directories, and the analysis notebook end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml

from srl_jax import analysis
from srl_jax.analysis.runs import t_quantile
from srl_jax.runtime.run_dir import STATUS, read_status

REPO = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_run(run_dir: Path, rows: list[dict[str, Any]], seed: int = 1, actors: int = 2,
             target: float | None = 475.0, state: str = "finished",
             restarts: tuple[int, ...] = (0, 0), frames: int = 40000) -> Path:
    """A run directory as the launcher leaves it: config.yaml, metrics.jsonl, status.json."""
    run_dir.mkdir(parents=True)
    config = {"name": "cartpole_ppo", "seed": seed,
              "env": {"id": "CartPole-v1", "kwargs": {}},
              "actors": {"count": actors, "envs": 16},
              "learner": {"algorithm": "ppo", "ppo": {"learning_rate": 1e-3, "target_kl": None}},
              "network": {"hidden": [64, 64]},
              "stop": {"env_frames": frames, "wall_time_s": 300.0, "target_return": target}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    workers = [{"name": f"actor-{i}", "kind": "actor", "index": i, "pid": 100 + i,
                "state": "stopped", "restarts": r} for i, r in enumerate(restarts)]
    status = {"experiment": "cartpole_ppo", "state": state,
              "stop_reason": f"{frames} env frames reached the limit {frames}", "workers": workers}
    (run_dir / STATUS).write_text(json.dumps(status))
    return run_dir


def rows_linear(slope: float, n: int = 6, frames_per_row: int = 1000,
                fps: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    """One warm-up row with no frames and no episode, then a return of slope * frames."""
    rows = [{"time": 1.0, "env_frames": 0, "fps": 0.0, "learner_steps": 0, "system/restarts": 0}]
    for i in range(1, n):
        frames = i * frames_per_row
        rows.append({"time": 1.0 + i, "env_frames": frames,
                     "fps": fps[i - 1] if fps else 1000.0, "learner_steps": i,
                     "episode_return_mean": slope * frames, "system/restarts": 0})
    return rows


def test_load_run_flattens_config_and_status(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", rows_linear(0.1), seed=7, restarts=(1, 2))
    df = analysis.load_run(run)
    assert len(df) == 6
    assert (df["run"] == str(run)).all()
    assert (df["experiment"] == "cartpole_ppo").all()
    assert df["config.seed"].iloc[0] == 7
    assert df["config.actors.count"].iloc[0] == 2
    assert df["config.learner.ppo.learning_rate"].iloc[0] == pytest.approx(1e-3)
    assert df["config.learner.ppo.target_kl"].iloc[0] is None
    assert df["config.network.hidden"].iloc[0] == "[64, 64]"
    assert df["config.env.kwargs"].iloc[0] == "{}"
    assert "config.learner" not in df and "config.learner.ppo" not in df
    assert df["status.state"].iloc[0] == "finished"
    assert df["status.restarts"].iloc[0] == 3
    # The warm-up row has no episode: NaN, not a missing column or a zero.
    assert math.isnan(df["episode_return_mean"].iloc[0])
    assert df["episode_return_mean"].iloc[-1] == pytest.approx(500.0)


def test_flatten_config_nested() -> None:
    flat = analysis.flatten_config({"a": {"b": {"c": 1}, "d": [1, "x"]}, "e": None})
    assert flat == {"config.a.b.c": 1, "config.a.d": '[1, "x"]', "config.e": None}


def test_torn_last_line_is_skipped_but_a_torn_middle_line_is_an_error(tmp_path: Path) -> None:
    run = make_run(tmp_path / "torn", rows_linear(0.1))
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"time": 7.0, "env_fra')
    df = analysis.load_run(run)
    assert len(df) == 6
    assert df["time"].max() == 6.0

    bad = make_run(tmp_path / "bad", rows_linear(0.1))
    lines = (bad / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:10]
    (bad / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:3"):
        analysis.load_run(bad)


def test_load_runs_finds_run_dirs_recursively_and_by_glob(tmp_path: Path) -> None:
    make_run(tmp_path / "sweep" / "seed1", rows_linear(0.1), seed=1)
    make_run(tmp_path / "sweep" / "deeper" / "seed2", rows_linear(0.1), seed=2)
    (tmp_path / "sweep" / "empty").mkdir()
    df = analysis.load_runs(tmp_path / "sweep")
    assert sorted(df["config.seed"].unique()) == [1, 2]
    assert len(df) == 12
    by_glob = analysis.load_runs(str(tmp_path / "sweep" / "seed*"))
    assert by_glob["config.seed"].unique().tolist() == [1]
    listed = analysis.load_runs([tmp_path / "sweep" / "seed1", tmp_path / "sweep" / "seed1"])
    assert listed["run"].nunique() == 1
    with pytest.raises(FileNotFoundError):
        analysis.load_runs(tmp_path / "sweep" / "empty")


def test_summarize_values(tmp_path: Path) -> None:
    # Return 0.1 * frames: 100, 200, 300, 400, 500 at 1000..5000 frames.
    rows = rows_linear(0.1, fps=(500.0, 900.0, 1000.0, 1100.0, 1200.0))
    run = make_run(tmp_path / "a", rows, target=250.0, restarts=(0, 1))
    s = analysis.summarize(run)
    assert s["final"] == pytest.approx(400.0)  # mean of the last 3 rows with a return
    assert s["max"] == pytest.approx(500.0)
    assert s["target"] == 250.0
    assert s["frames_to_target"] == 3000  # first row with return >= 250
    assert s["time_to_target"] == 4.0
    # Median over rows with frames, without the first of them: median(900, 1000, 1100, 1200).
    assert s["fps_median"] == pytest.approx(1050.0)
    assert s["env_frames"] == 5000 and s["learner_steps"] == 5 and s["time"] == 6.0
    assert s["restarts"] == 1
    assert s["state"] == "finished" and s["stop_reason"].startswith("40000")
    # An explicit target wins over the config's; one never reached gives NaN.
    assert analysis.summarize(run, target=450.0)["frames_to_target"] == 5000
    assert math.isnan(analysis.summarize(run, target=1e6)["frames_to_target"])
    # A DataFrame of one run gives the same; one of two runs is refused.
    assert analysis.summarize(analysis.load_run(run)) == s
    other = make_run(tmp_path / "b", rows_linear(0.1))
    with pytest.raises(ValueError, match="one run"):
        analysis.summarize(analysis.load_runs([run, other]))


def test_summarize_without_target_or_status(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", rows_linear(0.1), target=None)
    (run / STATUS).unlink()
    s = analysis.summarize(run)
    assert math.isnan(s["target"]) and math.isnan(s["frames_to_target"])
    assert s["restarts"] == 0  # from system/restarts
    assert s["state"] is None


def test_compare_groups_by_config_key(tmp_path: Path) -> None:
    # actors=2: slopes 0.1 and 0.2 (final returns 400 and 800); actors=4: slope 0.05 (200).
    make_run(tmp_path / "r1", rows_linear(0.1), seed=1, actors=2, target=300.0)
    make_run(tmp_path / "r2", rows_linear(0.2), seed=2, actors=2, target=300.0)
    make_run(tmp_path / "r3", rows_linear(0.05), seed=1, actors=4, target=300.0)
    df = analysis.load_runs(tmp_path)
    table = analysis.compare(df, "actors.count")
    assert table.index.tolist() == [2, 4]
    assert table.loc[2, "runs"] == 2 and table.loc[4, "runs"] == 1
    assert table.loc[2, "final_mean"] == pytest.approx(600.0)
    assert table.loc[2, "final_std"] == pytest.approx(np.std([400.0, 800.0], ddof=1))
    assert math.isnan(table.loc[4, "final_std"])
    # Target 300 from the config: reached at 3000 frames (slope 0.1) and 2000 (slope 0.2).
    assert table.loc[2, "reached"] == 2
    assert table.loc[2, "frames_to_target"] == pytest.approx(2500.0)
    assert table.loc[4, "reached"] == 0 and math.isnan(table.loc[4, "frames_to_target"])
    same = analysis.compare(df, "config.actors.count")
    assert same["final_mean"].tolist() == table["final_mean"].tolist()
    assert analysis.compare(df, "seed").loc[1, "runs"] == 2
    with pytest.raises(KeyError):
        analysis.compare(df, "actors.nope")


def test_curves_interpolate_onto_a_common_grid_with_a_t_band(tmp_path: Path) -> None:
    # Two runs logged at different frames: y = x and y = x + 10, both from 0 to 100.
    a = [{"time": t, "env_frames": x, "fps": 1.0, "episode_return_mean": x}
         for t, x in enumerate([0.0, 30.0, 100.0])]
    b = [{"time": t, "env_frames": x, "fps": 1.0, "episode_return_mean": x + 10}
         for t, x in enumerate([0.0, 50.0, 70.0, 100.0])]
    make_run(tmp_path / "a", a, seed=1)
    make_run(tmp_path / "b", b, seed=2)
    df = analysis.load_runs(tmp_path)
    data = analysis.curves(df, x="env_frames", points=11)
    assert data["x"].tolist() == pytest.approx(np.linspace(0, 100, 11))
    assert (data["n"] == 2).all()
    assert data["mean"].to_numpy() == pytest.approx(np.linspace(0, 100, 11) + 5)
    # Two runs 10 apart: std = sqrt(50), half-width = t(0.975, 1) * std / sqrt(2) = 12.706 * 5.
    half = 12.706 * 5.0
    assert (data["hi"] - data["mean"]).to_numpy() == pytest.approx(np.full(11, half), rel=1e-4)
    assert (data["mean"] - data["lo"]).to_numpy() == pytest.approx(np.full(11, half), rel=1e-4)
    std = analysis.curves(df, points=11, band="std")
    assert (std["hi"] - std["mean"]).to_numpy() == pytest.approx(np.full(11, math.sqrt(50)))
    assert analysis.curves(df, points=11, band=None)["lo"].isna().all()


def test_curves_shorter_run_and_groups(tmp_path: Path) -> None:
    # Run b stops at 50 frames: beyond it only run a counts, and there is no band.
    a = [{"time": 0.0, "env_frames": 0, "episode_return_mean": 0.0},
         {"time": 1.0, "env_frames": 100, "episode_return_mean": 100.0}]
    b = [{"time": 0.0, "env_frames": 0, "episode_return_mean": 20.0},
         {"time": 1.0, "env_frames": 50, "episode_return_mean": 70.0},
         {"time": 2.0, "env_frames": 60}]  # a row with no finished episode is left out
    c = [{"time": 0.0, "env_frames": 0, "episode_return_mean": 5.0},
         {"time": 1.0, "env_frames": 10, "episode_return_mean": 5.0}]
    make_run(tmp_path / "a", a, actors=2)
    make_run(tmp_path / "b", b, actors=2)
    make_run(tmp_path / "c", c, actors=8)
    df = analysis.load_runs(tmp_path)
    # span="common": the grid covers only the frames that both runs of a group have.
    common = analysis.curves(df, by="actors.count", points=11, span="common")
    common_two = common[common["group"] == 2]
    assert common_two["x"].tolist() == pytest.approx(np.linspace(0, 50, 11))
    assert (common_two["n"] == 2).all()
    assert common_two["mean"].to_numpy() == pytest.approx(10 + np.linspace(0, 50, 11))
    # By default (span="all") beyond 50 frames only run a counts, and there is no band there.
    data = analysis.curves(df, by="actors.count", points=11)
    two = data[data["group"] == 2].set_index("x")
    assert two.loc[50.0, "n"] == 2 and two.loc[50.0, "mean"] == pytest.approx(60.0)
    assert two.loc[60.0, "n"] == 1 and two.loc[60.0, "mean"] == pytest.approx(60.0)
    assert math.isnan(two.loc[60.0, "lo"]) and not math.isnan(two.loc[50.0, "lo"])
    eight = data[data["group"] == 8]
    assert eight["x"].max() == 10.0 and (eight["mean"] == 5.0).all() and (eight["n"] == 1).all()
    # Against time: the grid spans the group's times.
    assert analysis.curves(df, x="time", by="actors.count")["x"].max() == 1.0
    with pytest.raises(ValueError):
        analysis.curves(df, band="sem")


def make_apart_runs(parent: Path) -> pd.DataFrame:
    """Two seeds that share neither time nor frames: one stops before the other starts."""
    for seed, start in ((1, 0), (2, 20)):
        make_run(parent / f"seed{seed}", [
            {"time": float(start + i), "env_frames": 1000 * (start + i), "fps": 1000.0,
             "episode_return_mean": 10.0 * (start + i)} for i in range(11)], seed=seed)
    return analysis.load_runs(parent)


@pytest.mark.parametrize("x", ["time", "env_frames"])
def test_curves_of_runs_that_do_not_overlap(tmp_path: Path, x: str) -> None:
    df = make_apart_runs(tmp_path)
    scale = 1000.0 if x == "env_frames" else 1.0
    data = analysis.curves(df, x=x, points=31)  # x = 0, 1, ..., 30 (times scale)
    assert data["x"].to_numpy() == pytest.approx(scale * np.arange(31))
    # Each run is its own stretch of the curve; nobody between 10 and 20, and no band.
    expected_n = [1] * 11 + [0] * 9 + [1] * 11
    assert data["n"].tolist() == expected_n
    inside = data["n"] == 1
    assert data.loc[inside, "mean"].to_numpy() == pytest.approx(10 * data.loc[inside, "x"] / scale)
    assert data.loc[~inside, "mean"].isna().all() and data["lo"].isna().all()
    with pytest.raises(ValueError, match=r"share no .*seed1 0 to .*seed2 .*span='all'"):
        analysis.curves(df, x=x, span="common")


@pytest.mark.parametrize("x", ["time", "env_frames"])
def test_plot_curves_draws_runs_that_do_not_overlap(tmp_path: Path, x: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    df = make_apart_runs(tmp_path)
    ax = analysis.plot_curves(df, x=x, show_runs=True, band="std")
    mean, partial, *runs, _, _ = ax.get_lines()
    assert np.isnan(mean.get_ydata()).all()  # nowhere do both runs count
    xs, ys = partial.get_xdata(), partial.get_ydata()
    assert xs[np.isfinite(ys)].min() == df[x].min() and xs[np.isfinite(ys)].max() == df[x].max()
    scale = 1000.0 if x == "env_frames" else 1.0
    assert np.isnan(ys[(xs > 10 * scale) & (xs < 20 * scale)]).all()  # nothing between the runs
    assert [list(line.get_xdata()) for line in runs] == \
        [df.loc[df["config.seed"] == seed, x].tolist() for seed in (1, 2)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        ["cartpole_ppo (mean of 2)", "mean where not all runs have data", "single runs"]
    assert not ax.collections  # no band: never two runs at one x


def test_plot_curves_draws_the_mean_thick_only_where_every_run_counts(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    for seed, first in ((1, 0), (2, 50)):
        make_run(tmp_path / f"seed{seed}", [
            {"time": 0.0, "env_frames": first, "episode_return_mean": 1.0},
            {"time": 1.0, "env_frames": first + 100, "episode_return_mean": 1.0}], seed=seed)
    ax = analysis.plot_curves(analysis.load_runs(tmp_path), points=16)  # x = 0, 10, ..., 150
    mean, partial = ax.get_lines()[:2]
    assert mean.get_xdata()[np.isfinite(mean.get_ydata())].tolist() == [50, 60, 70, 80, 90, 100]
    # Dotted where one run counts, joined to the thick line at 50 and 100.
    assert partial.get_xdata()[np.isfinite(partial.get_ydata())].tolist() == \
        [0, 10, 20, 30, 40, 50, 100, 110, 120, 130, 140, 150]


def test_t_quantile() -> None:
    assert t_quantile(1) == pytest.approx(12.706)
    assert t_quantile(10) == pytest.approx(2.228)
    assert t_quantile(1000) == 1.96
    assert math.isnan(t_quantile(0))


def test_plot_curves_draws_one_line_and_band_per_group(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    for seed, slope in ((1, 0.1), (2, 0.12)):
        make_run(tmp_path / f"s{seed}", rows_linear(slope), seed=seed, actors=2)
    make_run(tmp_path / "s3", rows_linear(0.05), seed=1, actors=4)
    df = analysis.load_runs(tmp_path)
    ax = analysis.plot_curves(df, by="actors.count")
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["actors.count=2 (2 runs)", "actors.count=4 (1 run)"]
    assert len(ax.collections) == 1  # a band for the group of 2 runs only
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    mean = ax.get_lines()[0].get_ydata()
    assert band.max() > mean.max() and band.min() < mean.min()
    assert ax.get_xlabel() == "environment frames"
    assert ax.get_ylabel() == "episode return (mean)"
    with_runs = analysis.plot_curves(df, by="actors.count", show_runs=True, band="std")
    assert len(with_runs.get_lines()) == 2 + 3 + 1  # means, runs, the legend's "single runs"
    legend = [t.get_text() for t in with_runs.get_legend().get_texts()]
    assert legend == [*labels, "single runs"]
    path = tmp_path / "curves.png"
    ax.figure.savefig(path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_no_jax_import() -> None:
    code = "import sys, srl_jax.analysis; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.slow
def test_notebook_trains_what_it_lacks_and_saves_curves(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in ("python", "python3", sys.executable), spec.argv
    runs, frames = tmp_path / "runs", 40_000
    monkeypatch.setenv("SRL_NOTEBOOK_RUNS", str(runs))
    monkeypatch.setenv("SRL_NOTEBOOK_FRAMES", str(frames))  # short: the user's default is long
    # Left from earlier notebook runs: seed 1 finished with other settings (the target return
    # the notebook no longer stops on), so it is stale and trained again; seed 2 finished with
    # the notebook's settings, so it is reused, and it shares no wall time with seed 1.
    make_run(runs / "cartpole_ppo-seed1", rows_linear(0.01), seed=1, frames=frames)
    reused = make_run(runs / "cartpole_ppo-seed2", [
        {"time": 1000.0 + i, "env_frames": 4000 * i, "fps": 4000.0, "learner_steps": i,
         "episode_return_mean": 20.0 + 5 * i} for i in range(1, 11)],
        seed=2, target=None, frames=frames)
    reused_rows = (reused / "metrics.jsonl").read_bytes()
    population = make_population_run(runs / "cartpole_ppo_pbt")  # reused, not trained
    config = yaml.safe_load((population / "config.yaml").read_text())
    (population / "config.yaml").write_text(yaml.safe_dump({**config, "name": "cartpole_ppo_pbt"}))
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        "the committed notebook must have its outputs cleared"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()  # raises CellExecutionError if a cell fails
    trained = runs / "cartpole_ppo-seed1"
    assert read_status(trained)["state"] == "finished"
    config = yaml.safe_load((trained / "config.yaml").read_text())
    assert config["stop"]["env_frames"] == frames and config["stop"]["target_return"] is None
    assert analysis.summarize(trained)["env_frames"] >= frames
    assert (reused / "metrics.jsonl").read_bytes() == reused_rows
    for name in ("learning_curves_frames.png", "learning_curves_time.png", "population.png"):
        data = (runs / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        assert len(data) > 20_000, f"{name}: only {len(data)} bytes"


def make_population_run(run_dir: Path) -> Path:
    """A sweep of three learning rates as the launcher leaves it: m2 learns fastest."""
    rates = [1e-4, 3e-4, 1e-3]
    rows = [{"time": float(t), "env_frames": 3000 * t, "fps": 3000.0, "learner_steps": 0,
             **{f"policy/m{i}/episode_return_mean": 20.0 + 50 * t * (i + 1) for i in range(3)},
             **{f"policy/m{i}/env_frames": 1000 * t for i in range(3)},
             **{f"policy/m{i}/policy_version": 2 * t for i in range(3)},
             **{f"learner/m{i}/hp/learning_rate": rates[i] for i in range(3)}}
            for t in range(1, 11)]
    make_run(run_dir, rows)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["population"] = {"members": 3, "exploit": False,
                            "initial": {"learner.ppo.learning_rate": rates}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    status = json.loads((run_dir / STATUS).read_text())
    (run_dir / STATUS).write_text(json.dumps({**status, "started": 1000.0}))
    event = {"time": 1005.0, "member": "m0", "donor": "m2", "donor_step": 8, "version": 10,
             "old_hyperparams": {"learner.ppo.learning_rate": 1e-4},
             "hyperparams": {"learner.ppo.learning_rate": 8e-4}, "scores": {}}
    (run_dir / "population.jsonl").write_text(json.dumps(event) + "\n")
    return run_dir


def test_a_population_loads_as_one_run_per_member_and_a_sweep_compares(tmp_path: Path) -> None:
    run_dir = make_population_run(tmp_path / "sweep")
    df = analysis.load_population(run_dir)
    assert sorted(df["member"].unique()) == ["m0", "m1", "m2"]
    m2 = df[df["member"] == "m2"]
    assert m2["run"].iloc[0] == f"{run_dir}:m2"
    assert m2["env_frames"].tolist() == [1000 * t for t in range(1, 11)], "its own frames"
    assert m2["hp.learning_rate"].iloc[0] == 1e-3
    ranked = analysis.compare(df, "learner.ppo.learning_rate", target=300.0)
    assert list(ranked.index) == [1e-4, 3e-4, 1e-3]
    assert ranked["frames_to_target"].tolist() == [6000.0, 3000.0, 2000.0]
    lineage = analysis.load_lineage(run_dir)
    assert lineage[["time", "member", "donor"]].values.tolist() == [[5.0, "m0", "m2"]]
    assert lineage["hp.learner.ppo.learning_rate"].tolist() == [8e-4]
    ax = analysis.plot_population(df, lineage)
    assert len(ax.get_lines()) == 3 and len(ax.texts) == 1, "a curve each, an arrow per copy"
    with pytest.raises(ValueError, match="is no population run"):
        analysis.load_population(make_run(tmp_path / "single", rows_linear(0.01)))
