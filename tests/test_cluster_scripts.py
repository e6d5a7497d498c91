"""The Slurm and TPU VM scripts, against stand-ins for srun, scontrol, gcloud and the
hosts' python: every command is complete, parses, and asks for what the config needs;
shellcheck lints both. The TPU VM script also runs for real against a gcloud stand-in
that executes each remote command as ssh would (`bash -c`, its output piped, each host
its own $HOME) and a python stand-in that sleeps where Ray would run: every remote
start returns at once, the pid kept is the sleeper's, and the teardown stops it."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srl_jax.cluster.cli import main as cluster_main
from srl_jax.cluster.remote_shell import detached, stop_group
from srl_jax.dataflow.worker_kinds import worker_kind, worker_plan
from srl_jax.launch import launch_line_checks, parse_args

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
RECORDER = """#!{python}
import json, os, shutil, subprocess, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps([name, *sys.argv[1:], {{k: v for k, v in os.environ.items()
                                                   if k.startswith("RAY_AUTH")}}]) + "\\n")
args = sys.argv[1:]
if name == "scontrol":
    print("node-a\\nnode-b")
elif name == "srun" and args[-2:] == ["hostname", "--ip-address"]:
    print("10.0.0.1 fe80::1")
elif name == "gcloud" and "describe" in args:
    print(json.dumps({{"acceleratorType": "v4-32", "networkEndpoints": [
        {{"ipAddress": f"10.0.0.{{5 + i}}"}} for i in range(int(os.environ["WORKERS"]))]}}))
elif name == "gcloud" and os.environ.get("EXECUTE"):  # a remote host: HOSTS/<name>
    hosts = os.environ["HOSTS"]
    worker = next((a.split("=", 1)[1] for a in args if a.startswith("--worker=")), "")
    tpu = "tpus" in args
    words = [a for a in args[4 if tpu else 2:] if not a.startswith("-")]
    vm = words[-1].split(":")[0] if "scp" in args else words[0]
    names = ([f"tpu-{{i}}" for i in range(int(os.environ["WORKERS"]))] if worker == "all"
             else [f"tpu-{{worker}}"] if tpu else [vm])
    if "scp" in args:
        for host in names:
            for f in words[:-1]:
                shutil.copy(f, os.path.join(hosts, host, "srl_jax"))
    else:
        (command,) = [a.removeprefix("--command=") for a in args if a.startswith("--command=")]
        for host in names:
            code = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE,
                                  env={{**os.environ, "HOME": os.path.join(hosts, host)}},
                                  timeout=20).returncode
            if code:
                sys.exit(code)
"""
SLEEPER = """#!{python}
# A host's python: Ray's `start` sleeps, as `ray start --block` does; so does the run
# where RUN_SLEEPS is set; the rest of srl_jax returns at once; -c runs for real.
import json, os, sys, time
args = sys.argv[1:]
if args[0] == "-c":
    os.execv({python!r}, [{python!r}, *args])
what = {{"ray.scripts.scripts": "ray", "srl_jax.launch": "run"}}.get(args[1])
if what:
    with open(os.path.join(os.environ["HOME"], f"{{what}}_sleeper.json"), "w") as out:
        json.dump({{"pid": os.getpid(), "args": args, "env": dict(os.environ)}}, out)
    if what == "ray" or os.environ.get("RUN_SLEEPS"):
        time.sleep(120)
"""


def make_stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "gcloud", "fake-python"):
        tool = bin_dir / name
        tool.write_text(RECORDER.format(python=sys.executable))
        tool.chmod(0o755)
    sleeper = bin_dir / "sleeper-python"
    sleeper.write_text(SLEEPER.format(python=sys.executable))
    sleeper.chmod(0o755)
    return bin_dir


def generate(tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "launch.sh"
    assert cluster_main([*args, "--output", str(script)]) == 0
    lint = subprocess.run([str(SHELLCHECK), str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    return script


def run_with_stand_ins(tmp_path: Path, script: Path, env: dict[str, str],
                       *args: str) -> list[list]:
    """Run `script` with the stand-ins first on PATH; every command they saw."""
    record = tmp_path / "record.jsonl"
    result = subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **env, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
             "RECORD": str(record)})
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def checked_launch(args: list[str], environ: dict[str, str]):
    """The run's arguments, parsed by the launcher's own parser, and its config after
    the launcher's own checks, in the environment the script gives the run."""
    assert args[:2] == ["-m", "srl_jax.launch"], args
    parsed = parse_args(args[2:])
    assert parsed.backend == "ray" and parsed.ray_address and parsed.quiet
    return parsed, launch_line_checks(args[2:], environ)


def option(command: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in command if isinstance(a, str)
                and a.startswith(f"{name}=")]
    return value


def offered(ray_start: list[str]) -> dict[str, float]:
    (resources,) = [a.removeprefix("--resources=") for a in ray_start
                    if a.startswith("--resources=")]
    return json.loads(resources)


def test_the_slurm_job_gives_each_role_its_hosts_and_the_run_asks_for_them(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "shared" / "run"  # the script makes it
    python = str(make_stand_ins(tmp_path) / "fake-python")
    script = generate(tmp_path, "slurm", "cartpole_ppo", "--run-dir", str(run_dir),
                      "--python", python, "--actor-hosts", "3", "--inference-hosts",
                      "1", "--gpus-per-learner-host", "8", "--gpus-per-inference-host", "1",
                      "--cpus-per-host", "16", "--set", "learner.processes=2",
                      "--set", "actors.splits=4", "--set", "actors.count=9",
                      "--set", "inference.count=2", "--set", "checkpoint.shared=true",
                      "--allow-unauthenticated-coordinator")
    text = script.read_text()
    components = text.split("#SBATCH hetjob")
    assert len(components) == 3
    nodes = [int(re.search(r"#SBATCH --nodes=(\d+)", c).group(1)) for c in components]
    assert nodes == [2, 1, 3]
    assert "#SBATCH --gpus-per-node=8" in components[0]
    assert all("#SBATCH --cpus-per-task=16" in c for c in components)

    commands = run_with_stand_ins(tmp_path, script, {"SLURM_JOB_NODELIST_HET_GROUP_0": "n[1-2]"})
    tokens = {c[-1].get("RAY_AUTH_TOKEN") for c in commands if c[0] in ("srun", "fake-python")}
    (token,) = tokens
    assert re.fullmatch(r"[0-9a-f]{64}", token), "one token, made by the job, in every step"
    assert all(c[-1]["RAY_AUTH_MODE"] == "token" for c in commands if c[0] == "srun")
    checks = [c for c in commands if c[0] == "srun" and "-c" in c]
    assert sorted(int(option(c, "--het-group")) for c in checks) == [0, 1, 2], \
        "the interpreter is checked on every host"
    assert all(c[c.index("-c") - 1] == python for c in checks)
    calls = [c[1:-1] for c in commands if c[0] == "fake-python"]
    assert [c[:2] for c in calls] == [["-m", "srl_jax.cluster.ray_nodes"], ["-m", "srl_jax.launch"]]
    assert calls[0][2:] == ["10.0.0.1:6379", "6", "--timeout-s", "300"], "every node joins"
    run_env = next(c[-1] for c in commands if c[0] == "fake-python" and "srl_jax.launch" in c)
    parsed, config = checked_launch(calls[1], run_env)
    assert parsed.ray_address == "10.0.0.1:6379" and parsed.run_dir == run_dir
    assert config.learner.processes == 2 and config.actors.count == 9
    assert config.ray.learner == {"CPU": 1.0, "GPU": 8.0, "learner_host": 1.0}
    assert config.ray.inference == {"CPU": 1.0, "GPU": 0.5, "inference_host": 1.0}, \
        "the inference host's GPU shared by its two servers"
    assert config.ray.actor == {"CPU": 1.0, "actor_host": 1.0}

    # What each het group's Ray nodes offer holds exactly what the run asks for.
    total: dict[str, float] = {}
    hosts_started = [0, 0, 0]
    for start in (c[:-1] for c in commands if c[0] == "srun" and "start" in c):
        group = int(option(start, "--het-group"))
        hosts = int(option(start, "--nodes"))
        hosts_started[group] += hosts
        assert "--overlap" in start and "--num-cpus=16" in start
        assert start[start.index("-m") - 1] == python
        for key, amount in offered(start).items():
            total[key] = total.get(key, 0) + amount * hosts
        assert ("--head" in start) == (group == 0 and "--nodelist=node-a" in start)
    assert hosts_started == nodes, "a Ray node on every host of every group"
    assert total["learner_host"] == config.learner.processes
    assert total["inference_host"] >= config.inference.count
    assert total["actor_host"] >= config.actors.count


def test_slurm_servers_on_learner_hosts_share_the_gpus_kept_for_them(tmp_path: Path) -> None:
    """Two servers on a one-GPU learner host: each asks half of what is kept for them,
    and the learner the rest; kept none, they ask none (the plan puts them on the CPU)."""
    def asks(*extra: str) -> tuple[dict, dict]:
        script = generate(tmp_path, "slurm", "cartpole_ppo", "--run-dir", "/x", "--python",
                          sys.executable, "--gpus-per-learner-host", "1",
                          "--set", "inference.count=2", *extra)
        (launch,) = [line for line in script.read_text().splitlines()
                     if "srl_jax.launch" in line]
        overrides = dict(w.split("=", 1) for w in shlex.split(launch) if w.startswith("ray."))
        return overrides["ray.learner"], overrides["ray.inference"]

    assert asks("--gpus-for-inference", "0.5") == (
        "{CPU: 1, GPU: 0.5, learner_host: 1}", "{CPU: 1, GPU: 0.25, inference_host: 1}")
    assert asks() == ("{CPU: 1, GPU: 1, learner_host: 1}", "{CPU: 1, inference_host: 1}")


TPU_ARGS = ["tpu-vm", "cartpole_ppo", "--tpu", "v4-32", "--zone", "us-central2-b",
            "--hosts", "4", "--actor-vm", "cpu-1", "--actor-vm", "cpu 2",
            "--checkpoint-dir", "gs://bucket/cp", "--set", "learner.batch_envs=128",
            "--allow-unauthenticated-coordinator"]


def remote_commands(commands: list[list]) -> dict[str, list[str]]:
    """Each host's remote commands (gcloud ssh --command), in order, each checked to
    parse."""
    remote: dict[str, list[str]] = {}
    for call in (c[:-1] for c in commands if c[0] == "gcloud" and "ssh" in c):
        command = option(call, "--command")
        syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert syntax.returncode == 0, (command, syntax.stderr)
        where = next((a for a in call if a.startswith("--worker=")), None) or call[3]
        remote.setdefault(where, []).append(command)
    return remote


def test_the_tpu_vm_script_provisions_every_host_then_puts_one_learner_on_each(
        tmp_path: Path) -> None:
    make_stand_ins(tmp_path)
    script = generate(tmp_path, *TPU_ARGS, "--run-dir", "/mnt/runs/it's here")
    commands = run_with_stand_ins(tmp_path, script, {"WORKERS": "4"})
    gcloud = [c[:-1] for c in commands if c[0] == "gcloud"]
    first_start = next(i for i, c in enumerate(gcloud) if "ray.scripts.scripts" in str(c))
    copies = [c for c in gcloud[:first_start] if "scp" in c]
    assert [c[-3 if "tpus" in c else -2] for c in copies] == [
        "v4-32:srl_jax/", "cpu-1:srl_jax/", "cpu 2:srl_jax/"], "every host, before Ray"
    for copy in copies:
        names = sorted(Path(a).name for a in copy if a.startswith("/"))
        assert names == ["cluster.lock", "ray_token", "srl_jax-0.1.0-py3-none-any.whl"]
    remote = remote_commands(commands)
    assert set(remote) == {"--worker=0", "--worker=1", "--worker=2", "--worker=3",
                           "--worker=all", "cpu-1", "cpu 2"}
    for host in ("--worker=all", "cpu-1", "cpu 2"):
        prepare, install = remote[host][:2]
        assert prepare.startswith("/usr/bin/python3 -c ") and "mkdir -p" in prepare
        assert "/usr/bin/python3 -m venv \"$HOME\"/srl_jax/venv" in install
        assert ("\"$HOME\"/srl_jax/venv/bin/python -m pip install -q --require-hashes -r "
                "\"$HOME\"/srl_jax/cluster.lock") in install
        assert "--no-deps --force-reinstall \"$HOME\"/srl_jax/srl_jax-*.whl" in install
    starts = {w: shlex.split(next(c for c in remote[w] if "ray.scripts.scripts start" in c))
              for w in ("--worker=0", "--worker=1", "--worker=2", "--worker=3", "cpu-1",
                        "cpu 2")}
    for where, start in starts.items():
        assert start[:3] == ["set", "+m;", "setsid"] and "--block" in start, start
        assert start[-5:] == ["&", "echo", "$!", ">", "$HOME/srl_jax/ray.pid"], start
        assert "RAY_AUTH_MODE=token" in start
        assert "RAY_AUTH_TOKEN_PATH=$HOME/srl_jax/ray_token" in start
        assert ("SRL_JAX_PROCESS_ID=" + where[-1] in start) == where.startswith("--worker")
    head = starts["--worker=0"]
    assert "--head" in head and "--node-ip-address=10.0.0.5" in head
    wait, run = remote["--worker=0"][1:3]
    assert "-m srl_jax.cluster.ray_nodes 10.0.0.5:6379 6 --timeout-s 300" in wait
    words = shlex.split(run)
    assert words[:3] == ["env", "RAY_AUTH_MODE=token",
                         "RAY_AUTH_TOKEN_PATH=$HOME/srl_jax/ray_token"]
    assert words[3] == "$HOME/srl_jax/venv/bin/python"
    parsed, config = checked_launch(words[4:], dict(w.split("=", 1) for w in words[1:3]))
    assert parsed.ray_address == "10.0.0.5:6379"
    assert parsed.run_dir == Path("/mnt/runs/it's here")
    assert "checkpoint.dir=gs://bucket/cp" in parsed.overrides
    assert config.learner.processes == 4
    assert config.ray.learner == {"CPU": 1.0, "TPU": 4.0, "learner_host": 1.0}
    learners = [offered(starts[f"--worker={w}"]) for w in range(4)]
    assert learners == [{"learner_host": 1}] * 4
    helpers = [offered(starts[vm]) for vm in ("cpu-1", "cpu 2")]
    assert sum(h["actor_host"] for h in helpers) >= config.actors.count
    assert sum(h["inference_host"] for h in helpers) >= config.inference.count
    on_actor_hosts = [k for k, _, _ in worker_plan(config) if worker_kind(k).host_role == "actor"]
    assert helpers[0]["actor_host"] == math.ceil(len(on_actor_hosts) / 2)
    stops = remote["--worker=all"][-1], remote["cpu 2"][-1]
    assert all('kill -TERM -- "-$pid"' in s and "srl_jax/ray.pid" in s for s in stops), \
        "teardown by process group, from the pid kept"


def test_the_tpu_vm_script_refuses_a_slice_of_another_size(tmp_path: Path) -> None:
    make_stand_ins(tmp_path)
    script = generate(tmp_path, *TPU_ARGS, "--run-dir", "/x")
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
             "RECORD": str(tmp_path / "record"), "WORKERS": "2"})
    assert result.returncode == 2
    assert result.stderr.strip() == ("srl_jax: --hosts is 4, but TPU v4-32 (v4-32) has 2 "
                                     "hosts")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def sleepers(hosts: Path, what: str) -> dict[str, dict]:
    return {h.name: json.loads((h / f"{what}_sleeper.json").read_text())
            for h in sorted(hosts.iterdir()) if (h / f"{what}_sleeper.json").exists()}


@pytest.fixture
def executed_hosts(tmp_path: Path):
    """HOSTS/<host> for two TPU hosts and one CPU VM; any sleeper left is killed."""
    hosts = tmp_path / "hosts"
    for host in ("tpu-0", "tpu-1", "cpu-1"):
        (hosts / host / "srl_jax").mkdir(parents=True)
    yield hosts
    for what in ("ray", "run"):
        for found in sleepers(hosts, what).values():
            if alive(found["pid"]):
                os.kill(found["pid"], signal.SIGKILL)


def executed_tpu_script(tmp_path: Path, *flags: str) -> Path:
    """The TPU VM script of two TPU hosts and a CPU VM, for hosts whose python sleeps
    where Ray or the run would work."""
    python = str(make_stand_ins(tmp_path) / "sleeper-python")
    return generate(tmp_path, "tpu-vm", "cartpole_ppo", "--run-dir", "runs/cp", "--tpu", "t",
                    "--zone", "z", "--hosts", "2", "--actor-vm", "cpu-1",
                    "--checkpoint-dir", "gs://b/cp", "--no-install", "--python", python,
                    "--set", "learner.batch_envs=64", "--allow-unauthenticated-coordinator",
                    *flags)


@pytest.mark.slow  # the executed script's detached process trees: 10 s on 2 cores
def test_every_remote_start_returns_at_once_and_teardown_stops_the_real_process(
        tmp_path: Path, executed_hosts: Path) -> None:
    script = executed_tpu_script(tmp_path, "--detach")
    env = {"WORKERS": "2", "EXECUTE": "1", "HOSTS": str(executed_hosts), "RUN_SLEEPS": "1"}
    began = time.monotonic()
    run_with_stand_ins(tmp_path, script, env)
    assert time.monotonic() - began < 30, "no remote start holds its ssh session"
    deadline = time.monotonic() + 20  # detached: the sleepers may not have begun yet
    while (len(sleepers(executed_hosts, "ray")) < 3 or not sleepers(executed_hosts, "run")) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    rays, runs = sleepers(executed_hosts, "ray"), sleepers(executed_hosts, "run")
    assert set(rays) == {"tpu-0", "tpu-1", "cpu-1"} and set(runs) == {"tpu-0"}
    tokens = set()
    for host, found in rays.items():
        kept = int((executed_hosts / host / "srl_jax" / "ray.pid").read_text())
        assert kept == found["pid"] and alive(kept), "the pid kept is Ray's own"
        assert os.getpgid(kept) == kept, "it leads its own process group"
        tokens.add(Path(found["env"]["RAY_AUTH_TOKEN_PATH"]).read_text())
        assert found["env"]["RAY_AUTH_MODE"] == "token"
        assert found["env"].get("SRL_JAX_PROCESS_ID") == (
            host[-1] if host.startswith("tpu") else None), "learner rank = TPU worker id"
    (token,) = tokens
    assert re.fullmatch(r"[0-9a-f]{64}", token), "one token, the same on every host"
    run = runs["tpu-0"]
    assert int((executed_hosts / "tpu-0" / "srl_jax" / "run.pid").read_text()) == run["pid"]
    assert "--ray-address=10.0.0.5:6379" in run["args"]

    run_with_stand_ins(tmp_path, script, env, "stop")
    for found in [*rays.values(), run]:
        assert not alive(found["pid"]), "stopped by its pid"
    assert not list(executed_hosts.glob("*/srl_jax/*.pid"))


@pytest.mark.slow  # the executed script's process trees, run to their end: 8 s
def test_a_foreground_run_stops_ray_on_every_host_when_it_ends(
        tmp_path: Path, executed_hosts: Path) -> None:
    script = executed_tpu_script(tmp_path)
    run_with_stand_ins(tmp_path, script, {"WORKERS": "2", "EXECUTE": "1",
                                          "HOSTS": str(executed_hosts)})
    rays = sleepers(executed_hosts, "ray")
    assert len(rays) == 3 and not any(alive(r["pid"]) for r in rays.values())


def test_the_detached_line_runs_under_a_piped_shell_and_keeps_the_real_pid(
        tmp_path: Path) -> None:
    """The line itself, as an ssh session runs it: `bash -c LINE | cat` returns while
    the process lives on; the pid file holds the process, which leads its group."""
    pid_file, log = tmp_path / "x.pid", tmp_path / "x.log"
    line = detached(["sleep", "60"], shlex.quote(str(log)), shlex.quote(str(pid_file)),
                    {"A": "1"})
    began = time.monotonic()
    subprocess.run(["bash", "-c", f"bash -c {shlex.quote(line)} | cat"], timeout=10,
                   check=True)
    assert time.monotonic() - began < 5
    pid = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 5  # setsid and env exec it in that same process
        while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] != [b"sleep", b"60"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert alive(pid) and os.getpgid(pid) == pid
        subprocess.run(["bash", "-c", stop_group(shlex.quote(str(pid_file)))], timeout=30,
                       check=True)
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid) and not pid_file.exists()
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("args, message", [
    (["tpu-vm", "cartpole_ppo", "--run-dir", "/x", "--tpu", "t", "--zone", "z", "--hosts", "2",
      "--checkpoint-dir", "gs://b/x"],
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
