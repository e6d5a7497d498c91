"""The device placement plan, from described hosts: no real accelerator is needed."""

from __future__ import annotations

import re

import pytest

from srl_jax.config.checks import validate
from srl_jax.config.schema import ConfigError
from srl_jax.launch import main
from srl_jax.runtime.host_devices import HostDevices, _visible, describe_host, parse_gpu_query
from srl_jax.runtime.metrics import MetricsAggregator
from srl_jax.runtime.placement import (
    LEARNER_DEVICES_ENV,
    PlacementError,
    plan_placement,
    planned_learner_devices,
)
from tests.conftest import make_config


def gpus(count: int, name: str = "NVIDIA H100", mib: int = 81559) -> HostDevices:
    return HostDevices("gpu", count, name, mib, tuple(f"GPU-{i:04d}" for i in range(count)))


TPU_HOST = HostDevices("tpu", 4, "TPU")
WITH_EVALUATOR = ["evaluation.every_updates=10"]


def plan(host: HostDevices, *overrides: str, backend: str = "local"):
    return plan_placement(make_config(list(overrides)), host, backend)


def test_no_accelerator_keeps_everything_on_the_cpu() -> None:
    placement = plan(HostDevices(), *WITH_EVALUATOR)
    assert {p.platform for p in placement.workers.values()} == {"cpu"}
    assert all(p.env["JAX_PLATFORMS"] == "cpu" and "CUDA_VISIBLE_DEVICES" not in p.env
               for p in placement.workers.values())
    assert placement.workers["learner-0"].devices == (0,)
    assert placement.workers["learner-0"].env[LEARNER_DEVICES_ENV] == "0"
    forced = plan(HostDevices(count=4), "learner.devices=[1, 3]", "inference.device=cpu")
    assert forced.workers["learner-0"].devices == (1, 3)
    assert planned_learner_devices(forced.env("learner-0")) == [1, 3]
    assert planned_learner_devices({}) is None
    assert plan(HostDevices(count=4)).workers["learner-0"].devices == (0, 1, 2, 3)


def test_one_gpu_is_shared_with_shares_below_one() -> None:
    placement = plan(gpus(1), *WITH_EVALUATOR)
    learner, server, evaluator = (placement.workers[n] for n in (
        "learner-0", "inference-0", "evaluator-0"))
    assert learner.devices == server.devices == evaluator.devices == (0,)
    assert learner.memory == 0.6 and server.memory == evaluator.memory == 0.15
    assert learner.memory + server.memory + evaluator.memory < 1
    assert learner.env == {"CUDA_VISIBLE_DEVICES": "GPU-0000", "JAX_PLATFORMS": "cuda,cpu",
                           "XLA_CLIENT_MEM_FRACTION": "0.6", LEARNER_DEVICES_ENV: "0",
                           "XLA_PYTHON_CLIENT_MEM_FRACTION": ""}, "the deprecated name blanked"
    assert server.env["XLA_CLIENT_MEM_FRACTION"] == "0.15"
    assert placement.workers["actor-0"].env == {"JAX_PLATFORMS": "cpu"}
    on_demand = plan(gpus(1), "inference.device_memory=on_demand")
    assert on_demand.workers["inference-0"].env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "XLA_CLIENT_MEM_FRACTION" not in on_demand.workers["inference-0"].env


def test_two_gpus_give_the_learner_one_and_the_servers_the_other() -> None:
    placement = plan(gpus(2), "inference.count=2", *WITH_EVALUATOR)
    assert placement.workers["learner-0"].devices == (0,)
    assert placement.workers["learner-0"].memory == 0.9
    servers = [placement.workers[n] for n in ("inference-0", "inference-1", "evaluator-0")]
    assert all(s.devices == (1,) and s.memory == 0.3 for s in servers)
    assert servers[0].env["CUDA_VISIBLE_DEVICES"] == "GPU-0001"
    inline = plan(gpus(2), "actors.inline_inference=true")
    assert inline.workers["learner-0"].devices == (0, 1), "no servers: the learner takes both"
    cpu_servers = plan(gpus(2), "inference.device=cpu")
    assert cpu_servers.workers["learner-0"].devices == (0, 1)
    assert cpu_servers.workers["inference-0"].env == {"JAX_PLATFORMS": "cpu"}


def test_reanalysing_replay_servers_search_where_the_inference_servers_do() -> None:
    muzero = plan_placement(make_config([], "cartpole_muzero"), gpus(2), "local")
    assert muzero.workers["replay-0"].devices == muzero.workers["inference-0"].devices == (1,)
    assert muzero.workers["replay-0"].env["CUDA_VISIBLE_DEVICES"] == "GPU-0001"
    plain = plan_placement(make_config(["learner.muzero.reanalyse_fraction=0"],
                                       "cartpole_muzero"), gpus(2), "local")
    assert plain.workers["replay-0"].env == {"JAX_PLATFORMS": "cpu"}, "no search: no device"


def test_eight_gpus_split_by_the_documented_rule() -> None:
    placement = plan(gpus(8), "inference.count=2", "learner.batch_envs=192",
                     "actors.envs=96", *WITH_EVALUATOR)
    learner = placement.workers["learner-0"]
    assert learner.devices == (0, 1, 2, 3, 4, 5), "the first 8 - 8 // 4"
    assert learner.env["CUDA_VISIBLE_DEVICES"] == ",".join(f"GPU-{i:04d}" for i in range(6))
    assert learner.env[LEARNER_DEVICES_ENV] == "0,1,2,3,4,5", "indices in its own view"
    assert [placement.workers[n].devices for n in ("inference-0", "inference-1",
                                                    "evaluator-0")] == [(6,), (7,), (6,)]
    assert placement.workers["inference-0"].memory == 0.45
    # a batch of 32 does not split over 6 devices: the learner takes the most that it does
    assert plan(gpus(8)).workers["learner-0"].devices == (0, 1, 2, 3)
    pinned = plan(gpus(8), "learner.devices=[2, 3]", "inference.device=7")
    assert pinned.workers["learner-0"].devices == (2, 3)
    assert pinned.workers["inference-0"].devices == (7,)
    assert pinned.workers["learner-0"].memory == pinned.workers["inference-0"].memory == 0.9


def test_a_tpu_host_gives_the_learner_the_tpu_and_the_rest_the_cpu() -> None:
    placement = plan(TPU_HOST, *WITH_EVALUATOR)
    assert placement.workers["learner-0"].platform == "tpu"
    assert placement.workers["learner-0"].devices == (0, 1, 2, 3)
    assert placement.workers["learner-0"].env["JAX_PLATFORMS"] == "tpu,cpu"
    for name in ("inference-0", "evaluator-0", "actor-0"):
        assert placement.workers[name].env == {"JAX_PLATFORMS": "cpu"}
    with pytest.raises(PlacementError, match="only one process may open a TPU"):
        plan(TPU_HOST, "inference.device=0")
    with pytest.raises(PlacementError, match="one learner per TPU host"):
        plan(TPU_HOST, "learner.processes=2", "actors.splits=4")


@pytest.mark.parametrize(("host", "overrides", "message"), [
    (gpus(1), ["inference.device=3"], "'inference.device': device 3 does not exist: this "
     "host has 1 gpu device"),
    (HostDevices(count=4), ["learner.devices=[0, 5]"], "'learner.devices': device 5 does "
     "not exist: this host has no accelerator and 4 CPU device"),
    (HostDevices(), ["inference.device=0"], "this host has no accelerator: use cpu or auto"),
    (gpus(2), ["learner.devices=4"], "'learner.devices' is 4 but this host has 2 gpu"),
    (gpus(1), ["learner.device_memory=0.8", "inference.device_memory=0.3"],
     "device memory shares of gpu 0 add up to 1.10 (learner-0 0.8, inference-0 0.3)"),
    (gpus(4), ["learner.devices=[0, 1, 2]"], "'learner.batch_envs' (32) must divide evenly "
     "over the 3 learner devices of the plan (gpu 0,1,2)"),
    (gpus(2), ["learner.devices=[0]"], "with --backend ray, Ray chooses the devices"),
])
def test_impossible_placements_are_one_line_errors(host: HostDevices, overrides: list[str],
                                                   message: str) -> None:
    backend = "ray" if "Ray" in message else "local"
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        plan(host, *overrides, backend=backend)
    assert "\n" not in str(error.value)


def test_ray_gives_memory_in_proportion_to_the_gpus_asked_for() -> None:
    placement = plan(HostDevices(), "ray.learner={CPU: 1, GPU: 1}",
                     "ray.inference={CPU: 1, GPU: 0.25}", backend="ray")
    learner, server = placement.workers["learner-0"], placement.workers["inference-0"]
    assert (learner.platform, learner.memory, learner.devices) == ("gpu", 0.9, ())
    assert "CUDA_VISIBLE_DEVICES" not in learner.env, "Ray sets it for the GPUs it assigned"
    assert server.env["XLA_CLIENT_MEM_FRACTION"] == "0.225"
    assert placement.workers["actor-0"].env == {"JAX_PLATFORMS": "cpu"}
    with pytest.raises(PlacementError, match=re.escape("'inference.device' is cpu but 'ray.")):
        plan(HostDevices(), "inference.device=cpu", "ray.inference={GPU: 1}", backend="ray")


def test_the_plan_reads_like_a_table_and_goes_to_json() -> None:
    placement = plan(gpus(1), *WITH_EVALUATOR)
    lines = placement.lines()
    assert lines[0] == "placement: 1 x NVIDIA H100 (gpu, 81559 MiB each)"
    assert any(line.split()[:4] == ["learner-0", "gpu", "0", "memory"] for line in lines)
    assert lines[-1] == "  actor x2: cpu"
    data = placement.to_json()
    assert data["workers"]["inference-0"] == {"platform": "gpu", "devices": [0],
                                              "memory": 0.15}
    assert data["host"]["count"] == 1


def test_the_host_is_described_from_the_launcher_environment() -> None:
    assert describe_host({"JAX_PLATFORMS": "cpu"}) == HostDevices()
    assert describe_host({"JAX_PLATFORMS": "cpu", "XLA_FLAGS":
                          "--xla_force_host_platform_device_count=4"}).count == 4
    query = ("0, GPU-3f1a, NVIDIA H200, 143771\n1, GPU-77c0, NVIDIA H200, [N/A]\n"
             "No devices were found\n")
    assert parse_gpu_query(query) == [("0", "GPU-3f1a", "NVIDIA H200", 143771),
                                      ("1", "GPU-77c0", "NVIDIA H200", 0)]
    listed = [("0", "GPU-aa", "A", 1), ("1", "GPU-bb", "A", 1), ("2", "GPU-cc", "A", 1)]
    assert _visible(listed, None) == listed
    assert _visible(listed, "2,GPU-aa") == [listed[2], listed[0]]
    assert _visible(listed, "1,7,0") == [listed[1]], "CUDA stops at the first bad entry"
    assert _visible(listed, "") == []


@pytest.mark.parametrize(("override", "message"), [
    ("inference.device=gpu0", "'inference.device' must be 'auto', 'cpu' or a GPU id"),
    ("evaluation.device_memory=1.5", "'evaluation.device_memory' must be a fraction"),
    ("learner.device_memory=lots", "'learner.device_memory' must be a fraction in (0, 1], "
     "'on_demand' or 'auto'"),
    ("learner.devices=[0, 0]", "must list distinct device ids"),
])
def test_bad_placement_keys_are_refused_by_the_config_check(override: str, message: str
                                                            ) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(make_config([override]))


def test_launch_exits_2_with_one_line_on_an_impossible_placement(
        capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    run_dir = tmp_path / "run"
    assert main(["cartpole_ppo", "--run-dir", str(run_dir), "--set", "inference.device=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'inference.device' is 1, but this host has no " \
        "accelerator" in err
    assert not run_dir.exists(), "nothing was started or written"


def test_device_memory_rows_sum_live_workers_and_never_enter_totals() -> None:
    metrics = MetricsAggregator()
    metrics.observe("learner-0", "learner", {"device_memory_mib": 100.0,
                                             "device_memory_peak_mib": 150.0}, {})
    metrics.observe("inference-0", "inference", {"device_memory_mib": 10.0}, {})
    metrics.observe("inference-1", "inference", {"device_memory_mib": 5.0}, {})
    row = metrics.row(1.0)
    assert row["learner/device_memory_mib"] == 100.0
    assert row["learner/device_memory_peak_mib"] == 150.0
    assert row["inference/device_memory_mib"] == 15.0
    assert "evaluator/device_memory_mib" not in row
    metrics.retire("inference-1")
    assert metrics.row(2.0)["inference/device_memory_mib"] == 10.0
    assert metrics.total("inference", "device_memory_mib") == 10.0
