"""Config loading, overrides and validation; bad configs exit with code 2 and one line."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from srl_jax.config.env_families import SHIPPED, family_of
from srl_jax.config.loader import (
    SHIPPED_CONFIGS,
    config_dirs,
    config_from_dict,
    config_to_dict,
    load_config,
    resolve_experiment_path,
)
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.launch import check_before_launch
from srl_jax.launch import main as launch_main
from srl_jax.runtime.run_dir import STATUS
from tests.conftest import REPO, make_config, write_run_dir

DEFAULT = REPO / "configs" / "cartpole_ppo.yaml"


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "srl_jax.launch", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_default_config_loads_with_typed_overrides() -> None:
    config = load_config(DEFAULT, ["actors.count=3", "learner.ppo.learning_rate=1e-3",
                                   "stop.target_return=null", "env.kwargs={max_episode_steps: 9}",
                                   "network.hidden=[32, 16]", "inference.max_wait_ms=2"])
    assert config.name == "cartpole_ppo"
    assert config.actors.count == 3
    assert algorithm_config(config).learning_rate == pytest.approx(1e-3)
    assert config.stop.target_return is None
    assert config.env.kwargs == {"max_episode_steps": 9}
    assert config.network.hidden == [32, 16]
    assert isinstance(config.inference.max_wait_ms, float)


@pytest.mark.parametrize("override, key", [
    ("actors.cont=3", "'actors.cont' (did you mean 'actors.count'?)"),
    ("seed=-1", "'seed' must not be negative"),
    ("actors.count=two", "'actors.count' must be an integer"),
    ("actors.count=0", "'actors.count' must be at least 1"),
    ("inference.request_queue=0", "'inference.request_queue' must be at least 1"),
    ("inference.servers_per_actor=-1", "'inference.servers_per_actor' must be 0 (every server)"),
    ("learner.param_queue=0", "'learner.param_queue' must be at least 1"),
    ("runtime.stats_queue=0", "'runtime.stats_queue' must be at least 1"),
    ("actors.splits=3", "'actors.splits' (3) must divide 'actors.envs' (64)"),
    ("env.id=CartPol-v1", "'env.id': unknown gymnasium environment 'CartPol-v1'"),
    ("learner.batch_envs=12", "'learner.batch_envs' (12) must be a multiple"),
    ("learner.ppo.minibatches=7", "'learner.ppo.minibatches' (7) must divide"),
    ("inference.max_batch=63", "'inference.max_batch' (63) must hold the 64 rows of one "
                               "request: 32 envs a split (actors.envs / actors.splits), twice "
                               "over when a time limit ends episodes"),
    ("learner.devices=3", "'learner.batch_envs' (32) must divide evenly over 'learner.devices'"),
    ("learner.algorithm=td3", "'learner.algorithm': unknown 'td3'"),
    ("learner.publish_every_updates=0", "'learner.publish_every_updates' must be at least 1"),
    ("replay.count=1", "'replay.count': 'ppo' learns from fresh samples"),
    ("learner.ppo.anneal_lr=true", "'learner.ppo.anneal_lr' needs 'stop.env_frames'"),
    ("network.hidden=64", "'network.hidden' must be a list"),
    ("learner.ppo.normalize_advantages=maybe", "'learner.ppo.normalize_advantages' must be true"),
    ("learner.ppo.clip_coeff=0.1", "(did you mean 'learner.ppo.clip_coef'?)"),
    ("learner.ppo.epochs=0", "'learner.ppo.epochs' must be at least 1"),
    ("learner.ppoo.epochs=1", "unknown key 'learner.ppoo' (did you mean 'learner.ppo'?)"),
    ("learner.impala.minibatches=3", "'learner.impala.minibatches' (3) must divide"),
    ("learner.batch_env=32", "'learner.batch_env' (did you mean 'learner.batch_envs'?)"),
    ("plugins=[no_such_plugin]", "'plugins[0]': cannot import 'no_such_plugin'"),
    ("stop.target_eval_return=400", "'stop.target_eval_return' needs the evaluator"),
    ("env.backend=vector", "'env.backend': unknown 'vector'"),
    ("runtime.names=nfs", "'runtime.names': unknown 'nfs' (known: auto, files, network)"),
])
def test_validation_names_the_key(override: str, key: str) -> None:
    overrides = [override, "learner.algorithm=impala"] if "impala" in override else [override]
    with pytest.raises(ConfigError) as error:
        check_before_launch(load_config(DEFAULT, overrides))
    assert key in str(error.value)


def test_inline_inference_has_no_server_batch_to_fit() -> None:
    overrides = ["inference.max_batch=8", "actors.inline_inference=true"]
    assert check_before_launch(load_config(DEFAULT, overrides)).inference.max_batch == 8
    with pytest.raises(ConfigError, match=r"'inference.max_batch' \(8\) must hold the 64"):
        check_before_launch(load_config(DEFAULT, overrides[:1]))


def test_only_the_chosen_algorithm_section_is_checked_against_the_sizes() -> None:
    config = load_config(DEFAULT, ["learner.impala.minibatches=3"])
    assert check_before_launch(config).learner.algorithms["impala"]["minibatches"] == 3


def test_the_resolved_config_writes_the_chosen_section_whole() -> None:
    config = check_before_launch(load_config(DEFAULT, ["learner.ppo.epochs=2"]))
    written = config_to_dict(config)["learner"]
    assert written["ppo"]["epochs"] == 2 and written["ppo"]["clip_coef"] == 0.2
    assert "algorithms" not in written, "sections are written under their own names"
    assert config_from_dict(config_to_dict(config)) == config


ATARI = REPO / "configs" / "atari_breakout_ppo.yaml"


@pytest.mark.parametrize("override", ["network.hidden=[32]", "network.activation=relu"])
def test_nature_cnn_refuses_the_mlp_keys_it_would_ignore(override: str) -> None:
    assert load_config(ATARI).network.kind == "nature_cnn", "the shipped config passes"
    with pytest.raises(ConfigError) as error:  # the network's own check, with its algorithm's
        algorithm_config(load_config(ATARI, [override]))
    key = override.split("=")[0]
    assert str(error.value) == (f"'{key}' is not used by 'nature_cnn' (its layers are "
                                f"fixed); leave it unset")


def assert_one_config_error_line(code: int, stdout: str, stderr: str, fragment: str) -> None:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("srl_jax.launch: config error:")
    assert fragment in lines[0]
    assert stdout == ""


def assert_launch_refuses(args: list[str], fragment: str, run_dir: Path,
                          capsys: pytest.CaptureFixture) -> None:
    """`main` on `args` in this process: exit code 2, one line holding `fragment`, no
    warning, and nothing started in `run_dir`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = launch_main([*args, "--run-dir", str(run_dir)])
    stdout, stderr = capsys.readouterr()
    assert_one_config_error_line(code, stdout, stderr, fragment)
    assert [str(w.message) for w in caught] == []
    assert not run_dir.exists(), "nothing may start before validation passes"


@pytest.mark.parametrize("args, fragment", [
    (["cartpole_ppo", "--set", "actors.cont=3"], "unknown key 'actors.cont'"),
    (["cartpole_ppo", "--set", "learner.ppo.gamma=high"], "'learner.ppo.gamma' must be a number"),
    (["cartpole_ppo", "--set", "learner.ppo.clip_coef=x"],
     "'learner.ppo.clip_coef' must be a number, got 'x'"),
    (["cartpole_ppo", "--set", "env.id=NoSuchEnv-v0"], "unknown gymnasium environment"),
    (["cartpole_ppo", "--set", "actors.count=-1"], "'actors.count' must be at least 1"),
    (["cartpole_ppo", "--set", "env.id=FrozenLake-v1"], "Discrete observation space"),
    (["no_such_experiment"], "unknown experiment 'no_such_experiment'"),
    (["cartpole_ppo", "--backend", "slurm"], "'--backend': unknown 'slurm' (local, ray)"),
    (["cartpole_ppo", "--ray-address", "h:1"], "'--ray-address' needs '--backend ray'"),
    (["cartpole_ppo", "--set", "network.kind=nature_cnn"],
     "'network.kind': 'nature_cnn' needs image observations [H, W, C] and discrete actions; "
     "'CartPole-v1' has observations [4]"),
    (["cartpole_ppo", "--set", "network.kind=resnet"], "'network.kind': unknown 'resnet'"),
    (["cartpole_ppo", "--set", "env.policies={a: ['*']}"],
     "'env.policies' is for multi-agent environments ('pettingzoo:*', 'jaxmarl:*')"),
    (["mpe_spread_ppo", "--set", "learner.batch_envs=32"],
     "'learner.batch_envs' (32) must be a multiple of 24: policy 'default' sends chunks of 24 "
     "columns (8 envs x 3 agents)"),
])
def test_bad_config_is_one_line_and_exit_code_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        caplog: pytest.LogCaptureFixture, args: list[str], fragment: str) -> None:
    """`main` as `python -m srl_jax.launch` runs it, in this process (a process each would
    start JAX a dozen times): what it returns is the exit code, and neither a warning nor a
    log record may add to the one line a process would print."""
    monkeypatch.chdir(tmp_path)
    assert_launch_refuses(args, fragment, tmp_path / "run", capsys)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    """In a process of its own: the exit status, and a plugin's algorithm is unknown where
    no experiment names the plugin (this process registered 'a2c' importing its test)."""
    result = launch("cartpole_ppo", "--set", "learner.algorithm=a2c", "--run-dir",
                    str(tmp_path / "run"), cwd=tmp_path)
    assert_one_config_error_line(result.returncode, result.stdout, result.stderr,
                                 "'learner.algorithm': unknown 'a2c'")
    assert not (tmp_path / "run").exists(), "nothing may start before validation passes"


def test_experiment_names_find_shipped_configs_from_anywhere_and_local_ones_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name is looked up in ./configs, then among the configs srl_jax ships."""
    assert (SHIPPED_CONFIGS / "cartpole_ppo.yaml").read_text() == DEFAULT.read_text()
    monkeypatch.chdir(tmp_path)
    assert resolve_experiment_path("cartpole_ppo", config_dirs()) == DEFAULT.resolve()
    (tmp_path / "configs").mkdir()
    mine = tmp_path / "configs" / "cartpole_ppo.yaml"
    mine.write_text("actors:\n  count: 1\n")
    assert resolve_experiment_path("cartpole_ppo", config_dirs()) == mine.resolve()


def test_config_file_path_and_yaml_errors(tmp_path: Path) -> None:
    good = tmp_path / "mine.yaml"
    good.write_text("actors:\n  count: 1\nstop:\n  env_frames: 10\n")
    assert load_config(good).name == "mine"
    bad = tmp_path / "bad.yaml"
    bad.write_text("actors: [1, 2\n")
    result = launch(str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "is not valid YAML" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_used_run_dir_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    result = launch("cartpole_ppo", "--run-dir", str(run_dir), cwd=tmp_path)
    assert result.returncode == 2
    assert "already holds files" in result.stderr


def resume_error(tmp_path: Path, *args: str) -> str:
    result = launch(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srl_jax.launch: config error:"), lines
    return lines[0]


def test_resume_errors_are_one_line(tmp_path: Path) -> None:
    assert "no run of 'cartpole_ppo' with a checkpoint under runs/cartpole_ppo" in \
        resume_error(tmp_path, "cartpole_ppo", "--resume")
    other = tmp_path / "other"
    other.mkdir()
    assert "is not an srl_jax run directory" in \
        resume_error(tmp_path, "cartpole_ppo", "--resume", "--run-dir", str(other))
    run = write_run_dir(tmp_path / "run", make_config())
    assert "holds no complete checkpoint" in \
        resume_error(tmp_path, "cartpole_ppo", "--resume", "--run-dir", str(run))
    (run / "checkpoints" / "5.orbax-checkpoint-tmp").mkdir(parents=True)
    assert "holds no complete checkpoint" in \
        resume_error(tmp_path, "cartpole_ppo", "--resume", "--run-dir", str(run))
    (run / "checkpoints" / "4").mkdir()
    assert "'network' cannot change on resume" in resume_error(
        tmp_path, "cartpole_ppo", "--resume", "--run-dir", str(run), "--set",
        "network.hidden=[32]")
    assert "is a run of 'cartpole_ppo', not of 'cartpole_impala'" in \
        resume_error(tmp_path, "cartpole_impala", "--resume", "--run-dir", str(run))
    assert "'actors.count' must be at least 1" in resume_error(
        tmp_path, "cartpole_ppo", "--resume", "--run-dir", str(run), "--set", "actors.count=0")
    assert not (run / "metrics.jsonl").exists() and not (run / STATUS).exists()


def test_the_launcher_checks_a_config_without_importing_jax(tmp_path: Path) -> None:
    """JAX costs the launcher about a second before any worker starts (start-up time)."""
    code = ("import sys\n"
            "from srl_jax.launch import parse_args, prepare_run\n"
            f"prepare_run(parse_args(['cartpole_ppo', '--run-dir', {str(tmp_path / 'run')!r}]))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jax', 'jaxlib', 'flax', 'optax', 'orbax')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("env_id", "family"), [
    ("CartPole-v1", "gymnasium"), ("gymnasium_robotics:FetchReach-v4", "gymnasium"),
    ("ALE/Pong-v5", "atari"), ("HalfCheetah-v5", "mujoco"),
    ("pettingzoo:mpe2.simple_spread_v3", "pettingzoo")])
def test_an_env_id_finds_its_family_by_the_longest_pattern(env_id: str, family: str) -> None:
    assert family_of(EnvConfig(id=env_id)).name == family
    assert family_of(EnvConfig(id=env_id)).multi_agent == (family == "pettingzoo")


def test_the_config_checks_read_the_family_table_without_importing_an_env_package() -> None:
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from srl_jax.config.loader import load_config\n"
            "load_config(Path('configs/mpe_spread_ppo.yaml'))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('actors', 'gymnasium', 'pettingzoo', 'mpe2', 'ale_py', 'envpool', 'mujoco')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_only_the_env_families_test_an_ids_namespace() -> None:
    """No module outside `actors/env_families/` and the family table holds a family's id
    namespace ('ALE/', 'pettingzoo:', 'minatar:', 'jaxmarl:') in code (docstrings aside):
    callers ask the table."""
    namespaces = {pattern[:-1] for family in SHIPPED for pattern in family.ids
                  if pattern.endswith(("/*", ":*"))}
    assert namespaces == {"ALE/", "pettingzoo:", "minatar:", "jaxmarl:"}
    found = []
    for package in ("srl_jax", "actors", "learners", "replay", "bench"):
        for path in sorted((REPO / package).rglob("*.py")):
            where = path.relative_to(REPO)
            if where.parts[:2] == ("actors", "env_families") \
                    or where == Path("srl_jax/config/env_families.py"):
                continue
            tree = ast.parse(path.read_text())
            prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
            found += [f"{where}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and id(node) not in prose
                      and any(namespace in node.value for namespace in namespaces)]
    assert found == []
