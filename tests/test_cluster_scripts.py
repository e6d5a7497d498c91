"""The Slurm and TPU VM scripts, run against stand-ins for srun, scontrol, gcloud and
the hosts' python, which record every command: each is complete, parses, and asks
for what the config needs. shellcheck lints both."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from srl_jax.cluster import main as cluster_main
from srl_jax.config_loader import load_config, resolve_experiment_path
from srl_jax.launch import config_dirs, parse_args

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
RECORDER = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
args = sys.argv[1:]
if name == "scontrol":
    print("node-a\\nnode-b")
elif name == "srun" and args[-2:] == ["hostname", "--ip-address"]:
    print("10.0.0.1 fe80::1")
elif name == "gcloud" and "describe" in args:
    print("10.0.0.5")
"""


def generate(tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "launch.sh"
    assert cluster_main([*args, "--output", str(script)]) == 0
    lint = subprocess.run([str(SHELLCHECK), str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    return script


def run_with_stand_ins(tmp_path: Path, script: Path, env: dict[str, str]) -> list[list[str]]:
    """Run `script` with recording stand-ins first on PATH; every command they saw."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "gcloud", "fake-python"):
        tool = bin_dir / name
        tool.write_text(RECORDER.format(python=sys.executable))
        tool.chmod(0o755)
    record = tmp_path / "record.jsonl"
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=60,
        env={**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}",
             "RECORD": str(record)})
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def checked_launch(args: list[str]):
    """The run's arguments, parsed by the launcher's own parser, and its config."""
    assert args[:2] == ["-m", "srl_jax.launch"], args
    parsed = parse_args(args[2:])
    assert parsed.backend == "ray" and parsed.ray_address and parsed.quiet
    return parsed, load_config(resolve_experiment_path(parsed.experiment, config_dirs()),
                               parsed.overrides)


def option(command: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in command if a.startswith(f"{name}=")]
    return value


def offered(ray_start: list[str]) -> dict[str, float]:
    (resources,) = [a.removeprefix("--resources=") for a in ray_start
                    if a.startswith("--resources=")]
    return json.loads(resources)


def test_the_slurm_job_gives_each_role_its_hosts_and_the_run_asks_for_them(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "shared" / "run"  # the script makes it
    script = generate(tmp_path, "slurm", "cartpole_ppo", "--run-dir", str(run_dir),
                      "--python", "fake-python", "--actor-hosts", "3", "--inference-hosts",
                      "1", "--gpus-per-learner-host", "8", "--cpus-per-host", "16",
                      "--set", "learner.processes=2", "--set", "actors.splits=4",
                      "--set", "actors.count=9", "--set", "inference.count=2")
    text = script.read_text()
    components = text.split("#SBATCH hetjob")
    assert len(components) == 3
    nodes = [int(re.search(r"#SBATCH --nodes=(\d+)", c).group(1)) for c in components]
    assert nodes == [2, 1, 3]
    assert "#SBATCH --gpus-per-node=8" in components[0]
    assert all("#SBATCH --cpus-per-task=16" in c for c in components)

    commands = run_with_stand_ins(tmp_path, script, {"SLURM_JOB_NODELIST_HET_GROUP_0": "n[1-2]"})
    runs = [c[1:] for c in commands if c[0] == "fake-python" and "srl_jax.launch" in c]
    assert len(runs) == 1
    parsed, config = checked_launch(runs[0])
    assert parsed.ray_address == "10.0.0.1:6379" and parsed.run_dir == run_dir
    assert config.learner.processes == 2 and config.actors.count == 9
    assert config.ray.learner == {"CPU": 1.0, "GPU": 8.0, "learner_host": 1.0}
    assert config.ray.inference == {"CPU": 1.0, "inference_host": 1.0}
    assert config.ray.actor == {"CPU": 1.0, "actor_host": 1.0}

    # What each het group's Ray nodes offer holds exactly what the run asks for.
    total: dict[str, float] = {}
    hosts_started = [0, 0, 0]
    for start in (c for c in commands if c[0] == "srun" and "start" in c):
        group = int(option(start, "--het-group"))
        hosts = int(option(start, "--nodes"))
        hosts_started[group] += hosts
        assert "--overlap" in start and "--num-cpus=16" in start
        for key, amount in offered(start).items():
            total[key] = total.get(key, 0) + amount * hosts
        assert ("--head" in start) == (group == 0 and "--nodelist=node-a" in start)
    assert hosts_started == nodes, "a Ray node on every host of every group"
    assert total["learner_host"] == config.learner.processes
    assert total["inference_host"] >= config.inference.count
    assert total["actor_host"] >= config.actors.count


def test_the_tpu_vm_script_puts_one_learner_on_each_host_and_quotes_remote_commands(
        tmp_path: Path) -> None:
    script = generate(tmp_path, "tpu-vm", "cartpole_ppo", "--run-dir", "/mnt/runs/it's here",
                      "--tpu", "v4-32", "--zone", "us-central2-b", "--hosts", "4",
                      "--actor-vm", "cpu-1", "--actor-vm", "cpu 2", "--python", "python3",
                      "--set", "learner.batch_envs=128")
    commands = run_with_stand_ins(tmp_path, script, {})
    ssh = [c for c in commands if c[0] == "gcloud" and "ssh" in c]
    remote = {}
    for call in ssh:
        (command,) = [a.removeprefix("--command=") for a in call if a.startswith("--command=")]
        syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert syntax.returncode == 0, (command, syntax.stderr)
        where = next((a for a in call if a.startswith("--worker=")), None) or call[3]
        remote.setdefault(where, []).append(command)
    # Ray on TPU hosts 0..3 and on both CPU VMs, the run on host 0, the teardown.
    assert set(remote) == {"--worker=0", "--worker=1", "--worker=2", "--worker=3",
                           "--worker=all", "cpu-1", "cpu 2"}
    assert all(c.startswith("cd srl_jax && nohup env RAY_AUTH_MODE=token python3 -m ray")
               for w in ("--worker=1", "cpu 2") for c in remote[w][:1])
    head, run = remote["--worker=0"]
    assert "--head" in shlex.split(head) and "--node-ip-address=10.0.0.5" in shlex.split(head)
    words = shlex.split(run.removeprefix("cd srl_jax && "))
    assert words[:3] == ["env", "RAY_AUTH_MODE=token", "python3"]
    parsed, config = checked_launch(words[3:])
    assert parsed.ray_address == "10.0.0.5:6379"
    assert parsed.run_dir == Path("/mnt/runs/it's here")
    assert config.learner.processes == 4 and config.ray.learner["learner_host"] == 1
    learners = [offered(shlex.split(c)) for w in ("--worker=0", "--worker=1", "--worker=2",
                                                   "--worker=3") for c in remote[w][:1]]
    assert learners == [{"learner_host": 1}] * 4
    helpers = [offered(shlex.split(remote[vm][0])) for vm in ("cpu-1", "cpu 2")]
    assert sum(h["actor_host"] for h in helpers) >= config.actors.count
    assert sum(h["inference_host"] for h in helpers) >= config.inference.count
    assert helpers[0]["actor_host"] == math.ceil(config.actors.count / 2)
    assert "kill $(cat /tmp/srl_jax_ray.pid)" in remote["--worker=all"][0], "teardown by pid"


@pytest.mark.parametrize("args, message", [
    (["tpu-vm", "cartpole_ppo", "--run-dir", "/x", "--tpu", "t", "--zone", "z", "--hosts", "2"],
     "'--actor-vm': at least one CPU VM"),
    (["slurm", "cartpole_ppo", "--run-dir", "/x", "--set", "actors.cont=3"],
     "unknown key 'actors.cont'"),
    (["slurm", "cartpole_ppo", "--run-dir", "/x", "--set", "learner.processes=2"],
     "'learner.batch_envs' (32) must be a multiple"),
])
def test_a_layout_that_cannot_work_is_one_line(args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "srl_jax.cluster", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.startswith("srl_jax.cluster: config error: ") and message in \
        result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
