"""Where the cluster scripts put every worker, worked out before anything is written: every
shipped config is placed on a Slurm job and either placed on a 2-host TPU slice or refused
in one line; learners of several policies or members share their hosts' GPUs; a worker
with no room, a launch line the launcher would refuse, and a coordinator opened without
its flag stop the generator in one line."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from srl_jax.cluster.cli import main as cluster_main
from srl_jax.cluster.cli import parse_args, planned
from srl_jax.cluster.host_plan import HostPlan
from srl_jax.cluster.roles import share
from srl_jax.cluster.tpu import CLUSTER_EXTRAS, LOCK
from srl_jax.config.schema import ConfigError
from tests.test_cluster_scripts import generate

CONFIGS = sorted(p.stem for p in (Path(__file__).parents[1] / "srl_jax" / "configs")
                 .glob("*.yaml"))
TPU = ["--tpu", "t", "--zone", "z", "--actor-vm", "cpu-1", "--checkpoint-dir", "gs://b/x"]
SEVERAL_LEARNERS = {"mpe_speaker_listener_mappo", "mpe_speaker_listener_ppo", "mpe_tag_ppo",
                    "cartpole_ppo_pbt"}


def plan_of(*argv: str) -> HostPlan:
    return planned(parse_args(list(argv)))[1]


def fits(plan: HostPlan) -> None:
    """Every host's workers ask no more than it offers, each resource."""
    for host in plan.hosts:
        for key, offered in host.offer.items():
            asked = sum(ask.get(key, 0) for _, ask in plan.workers[host.name])
            assert asked <= offered + 1e-9, (host, key, asked)


@pytest.mark.parametrize("experiment", CONFIGS)
def test_every_shipped_config_is_placed_on_slurm_and_on_a_tpu_slice_or_refused(
        experiment: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Dry runs of both scripts, and both scripts written and linted (shellcheck)."""
    generate(tmp_path, "slurm", experiment, "--run-dir", "/x")
    assert cluster_main(["slurm", experiment, "--run-dir", "/x", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    plan = plan_of("slurm", experiment, "--run-dir", "/x")
    placed = [name for workers in plan.workers.values() for name, _ in workers]
    assert len(placed) == len(set(placed)) > 0
    assert all(f"  {name} " in printed for name in placed), "the dry run names each worker"
    assert "the launcher's checks passed" in printed
    fits(plan)

    code = cluster_main(["tpu-vm", experiment, "--run-dir", "runs/x", "--hosts", "2", *TPU,
                         "--allow-unauthenticated-coordinator", "--dry-run"])
    out, err = capsys.readouterr()
    assert (code, bool(out), len(err.splitlines())) in [(0, True, 0), (2, False, 1)], err
    code = cluster_main(["tpu-vm", experiment, "--run-dir", "runs/x", "--hosts", "1", *TPU,
                         "--dry-run"])
    out, err = capsys.readouterr()
    several = "learners" in err and "a TPU slice runs one" in err
    assert (code, several) == ((2, True) if experiment in SEVERAL_LEARNERS else (0, False)), err
    if not code:
        generate(tmp_path, "tpu-vm", experiment, "--run-dir", "runs/x", "--hosts", "1", *TPU)


def test_learners_of_several_members_share_their_hosts_gpus() -> None:
    one_host = plan_of("slurm", "cartpole_ppo_pbt", "--run-dir", "/x",
                       "--gpus-per-learner-host", "4", "--cpus-per-host", "16")
    learner_host = one_host.hosts[0]
    assert [h.name for h in one_host.hosts] == ["learner host 0", "actor host 0"]
    learners = [ask for name, ask in one_host.workers[learner_host.name]
                if name.startswith("learner-")]
    assert learners == [{"CPU": 1.0, "GPU": 1.0, "learner_host": 1.0}] * 4
    assert learner_host.offer["learner_host"] == 4 and learner_host.offer["GPU"] == 4
    fits(one_host)

    fewest = plan_of("slurm", "cartpole_ppo_pbt", "--run-dir", "/x")
    assert [h.name for h in fewest.hosts] == ["learner host 0", "learner host 1",
                                              "actor host 0"], "8 CPUs hold 5 of 9 workers"
    fits(fewest)
    assert "checkpoint.shared=true" in fewest.launch, "a Slurm run directory is shared"
    with pytest.raises(ConfigError, match="the donors' checkpoints the losers copy"):
        plan_of("slurm", "cartpole_ppo_pbt", "--run-dir", "/x", "--local-run-dir")
    spread = plan_of("slurm", "mpe_tag_ppo", "--run-dir", "/x", "--learner-hosts", "2",
                     "--gpus-per-learner-host", "2")
    per_host = [[ask for name, ask in spread.workers[h.name] if name.startswith("learner-")]
                for h in spread.hosts if h.name.startswith("learner")]
    assert per_host == [[{"CPU": 1.0, "GPU": 2.0, "learner_host": 1.0}]] * 2
    fits(spread)


@pytest.mark.parametrize("total, workers, each", [
    (4, 4, 1.0), (3, 2, 1.0), (8, 3, 2.0), (3, 4, 0.5), (1, 3, 0.3333), (2, 3, 0.5),
    (0.5, 1, 0.5), (0, 2, 0.0)])
def test_a_gpu_share_is_whole_devices_or_a_fraction_that_packs_on_one(
        total: float, workers: int, each: float) -> None:
    """Ray refuses a fraction above one GPU, and places 1/k shares k to a device: 0.75
    each of 3 GPUs for 4 learners would leave one unplaced."""
    assert share(total, workers) == each and each * workers <= total


def test_two_processes_of_one_learner_never_share_a_gpu() -> None:
    with pytest.raises(ConfigError, match=r"each of the 2 learner processes on a host 0.5 of "
                                          r"a GPU, and 'learner.processes' 2: two processes "
                                          r"of one learner could get the same GPU"):
        plan_of("slurm", "mpe_tag_ppo", "--run-dir", "/x", "--gpus-per-learner-host", "1",
                "--set", "learner.processes=2", "--allow-unauthenticated-coordinator")
    whole = plan_of("slurm", "mpe_tag_ppo", "--run-dir", "/x", "--gpus-per-learner-host", "2",
                    "--set", "learner.processes=2", "--allow-unauthenticated-coordinator")
    fits(whole)


def test_a_two_host_slice_script_opens_its_coordinator_only_by_the_flag() -> None:
    argv = ["tpu-vm", "cartpole_ppo", "--run-dir", "runs/x", "--hosts", "2", *TPU,
            "--set", "learner.batch_envs=64"]
    with pytest.raises(ConfigError, match=r"'--hosts' 2: .* no authentication .*"
                                          r"--allow-unauthenticated-coordinator"):
        planned(parse_args(argv))
    plan = plan_of(*argv, "--allow-unauthenticated-coordinator")
    assert "transport.allow_unauthenticated=true" in plan.launch
    assert [len(plan.workers[f"TPU host {w}"]) for w in (0, 1)] == [1, 1], \
        "one learner process on each TPU host"


@pytest.mark.parametrize("args, message", [
    (["--set", "learner.processes=2", "--set", "learner.batch_envs=64"],
     "'learner.processes' 2: the learner's processes meet through jax.distributed's "
     "coordinator and collectives, which have no authentication"),
    (["--set", "transport.allow_unauthenticated=true"],
     "'--set transport.allow_unauthenticated': a script gets it from "
     "'--allow-unauthenticated-coordinator'"),
    (["--actor-hosts", "1", "--cpus-per-host", "2", "--set", "actors.count=5"],
     "actor-2 cannot be placed: it asks CPU 1, actor_host 1, and what the hosts have left "
     "is: actor host 0 CPU 0, actor_host 3"),
    (["--set", "env.id=NoSuchEnv-v0"],
     "the launcher would refuse the script's launch line: "),
    (["--gpus-per-learner-host", "1", "--gpus-for-inference", "0.5", "--set",
      "inference.device=cpu"],
     "the launcher would refuse the script's launch line: 'inference.device' is cpu but "
     "'ray.inference' asks for"),
    (["--dry-run", "--submit", "--output", "/tmp/never-written.sh"],
     "'--dry-run' writes and submits nothing"),
])
def test_what_would_not_run_stops_the_generator_in_one_line(args: list[str],
                                                            message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "srl_jax.cluster", "slurm", "cartpole_ppo",
                             "--run-dir", "/x", *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.startswith("srl_jax.cluster: config error: ") and message in \
        result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_hosts_lock_installs_the_extras_the_slice_check_counts_on() -> None:
    root = Path(__file__).parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["cluster"]
    assert extras == [f"srl-jax[{','.join(CLUSTER_EXTRAS)}]"]
    assert f"compile {LOCK} --extra cluster " in (root / "scripts" / "lock.sh").read_text()
