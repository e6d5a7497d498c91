"""Bounded fan-in (srl_jax/dataflow/fan_in.py, srl_jax/wire/peer_set.py): each actor joins
`inference.servers_per_actor` servers, its host's first, then `rank % n`; a lost server is
replaced by the next live one and its requests are sent again at once; the launcher
checks the plan's sockets against the open-file limit."""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from pathlib import Path

import pytest
import zmq

from srl_jax.dataflow.fan_in import server_order, servers_per_actor
from srl_jax.dataflow.plan import OTHER_FILES, Carriers, make_plan
from srl_jax.launch import main as launch_main
from srl_jax.wire.peer_set import PeerSet
from tests.conftest import (
    Processes,
    all_running,
    last_row,
    make_config,
    read_metrics,
    read_status,
    wait_for,
    worker,
)
from tests.paced_env import SMALL_PACED_RUN


def test_an_actor_takes_its_hosts_servers_first_then_rank_mod_n() -> None:
    hosts = ["b", "a", "b", "c", "a"]
    assert server_order(0, "a", hosts) == [1, 4, 0, 2, 3]
    assert server_order(1, "a", hosts) == [4, 1, 2, 3, 0]
    assert server_order(5, "d", hosts) == [0, 1, 2, 3, 4], "no server on its host: rank % n"
    firsts = [server_order(rank, "x", ["y"] * 4)[:2] for rank in range(8)]
    assert all(sum(i in pair for pair in firsts) == 4 for i in range(4)), "spread evenly"
    assert servers_per_actor(2, 4) == 2 and servers_per_actor(0, 4) == 4
    assert servers_per_actor(8, 3) == 3


def test_a_peer_set_replaces_a_lost_server_by_the_next_live_one_and_returns() -> None:
    """Three real ROUTER sockets, a DEALER joined to one: when that one dies, the DEALER
    tries the next, finds it refused (dead too), moves on to the third; when the first is
    back on its port, the DEALER returns to it and lets the third go."""
    context: zmq.Context = zmq.Context.instance()
    routers: dict[str, zmq.Socket] = {}
    endpoints: dict[str, str] = {}
    joined: dict[str, str] = {}

    def serve(key: str) -> None:
        routers[key] = router = context.socket(zmq.ROUTER)
        if key in endpoints:
            router.bind(endpoints[key])
        else:
            endpoints[key] = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"

    def connect(key: str) -> None:
        dealer.connect(endpoints[key])
        joined[endpoints[key]] = key

    def disconnect(key: str) -> None:
        dealer.disconnect(endpoints[key])
        del joined[endpoints[key]]

    for key in "abc":
        serve(key)
    dealer = context.socket(zmq.DEALER)
    peers = PeerSet(dealer, ["a", "b", "c"], 1, connect, disconnect, lambda: dict(joined))
    try:
        wait_for(lambda: peers.check() or peers.up == {"a"}, 5, "joined to a")
        routers["b"].close(linger=0)
        routers["a"].close(linger=0)
        dropped = []

        def on_c() -> bool:
            dropped.append(peers.check())
            return "c" in peers.up

        wait_for(on_c, 5, "moved to c")
        assert any(dropped), "a dropped with requests possibly in flight"
        assert peers.connected == ["a", "c"] and peers.lost == {"a", "b"}
        assert set(joined.values()) == {"a", "c"}, "b, refused, let go"
        serve("a")
        assert wait_for(lambda: peers.check(), 5, "a back: c let go")
        assert peers.connected == ["a"] and set(joined.values()) == {"a"} and peers.lost == {"b"}
    finally:
        peers.close()
        dealer.close(linger=0)
        for router in routers.values():
            router.close(linger=0)


def test_the_plan_counts_each_actors_bounded_servers() -> None:
    def sockets(bound: int) -> dict[str, int]:
        return make_plan(make_config(["actors.count=8", "inference.count=4",
                                      f"inference.servers_per_actor={bound}"]),
                         Carriers()).sockets()

    bounded, every = sockets(2), sockets(0)
    assert every["actor"] - bounded["actor"] == 2, "2 servers, not 4"
    assert bounded["inference"] == every["inference"] - 2, "8 x 2 over the 3 left, not 8"
    plan = make_plan(make_config(["actors.count=8", "inference.count=4"]))
    assert plan.open_files_problem(max(plan.sockets().values()) + OTHER_FILES) is None
    problem = plan.open_files_problem(OTHER_FILES)
    assert problem is not None and "'controller' needs up to" in problem


def test_the_launcher_exits_2_where_this_hosts_open_file_limit_cannot_hold_the_plan(
        capsys: pytest.CaptureFixture[str]) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard != resource.RLIM_INFINITY, "a host with a hard limit of open files"
    code = launch_main(["cartpole_ppo", "--plan", "--set", f"actors.count={hard // 2}",
                        "--set", "transport.shared_memory=off"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "open files" in err and f"limit of {hard}" in err


def open_files(pid: int) -> int:
    """The soft limit of open files of process `pid` (/proc, Linux)."""
    line = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if line.startswith("Max open files"))
    return int(line.split()[3])


def established_ports(pid: int) -> list[int]:
    """The remote ports of the TCP connections process `pid` holds (/proc, Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and fields[9] in inodes:  # ESTABLISHED
            ports.append(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.slow
def test_actors_hold_two_of_four_servers_and_lose_no_request_to_a_killed_one(
        processes: Processes, tmp_path: Path) -> None:
    """8 actors, 4 servers, 2 servers per actor, over ZeroMQ (as across hosts), launched
    under a soft limit of 1,024 open files, which every process raises. Each actor
    holds 2 server connections; SIGKILL of a server: its actors send their unanswered
    requests again at once (one split each, and an inference timeout of 60 s, so a lost
    request would stall its actor; chunks dropped rather than waited on, so that what an
    actor waits on is its request), every actor steps on, and none waits for a timeout."""
    run_dir = tmp_path / "run"
    args = ["bash", "-c", 'ulimit -Sn 1024 && exec "$@"', "bash", sys.executable, "-m",
            "srl_jax.launch", "cartpole_ppo", "--run-dir", str(run_dir)]
    for override in (*SMALL_PACED_RUN, "actors.count=8", "actors.envs=2", "actors.splits=1",
                     "inference.count=4", "inference.servers_per_actor=2",
                     "inference.max_batch=4", "inference.min_padded_batch=4",
                     "transport.shared_memory=off", "actors.inference_timeout_s=60",
                     "actors.send_policy=drop", "evaluation.every_updates=0",
                     "stop.target_return=null", "stop.wall_time_s=300",
                     "runtime.stats_interval_s=0.2"):
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    wait_for(lambda: process.poll() is not None or (all_running(run_dir)
             and last_row(run_dir).get("env_frames")), 120, "every worker running and stepping")
    assert process.poll() is None, (tmp_path / "launch.log").read_text()
    status = read_status(run_dir)
    server_of = {int((run_dir / "names" / f"port.inference.{i}").read_text().rsplit(":", 1)[1]):
                 i for i in range(4)}
    actors = [w for w in status["workers"] if w["kind"] == "actor"]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pids = [status["controller_pid"], *(w["pid"] for w in status["workers"])]
    assert {open_files(pid) for pid in pids} == {hard}, \
        "the controller and each worker, started under a soft limit of 1,024, raised it"

    def held() -> dict[str, list[int]]:
        return {w["name"]: sorted(server_of[port] for port in established_ports(w["pid"])
                                  if port in server_of) for w in actors}

    before = wait_for(lambda: (now := held()) and all(len(s) == 2 for s in now.values())
                      and now, 10, "every actor joined to 2 servers")
    os.kill(worker(status, "inference-0")["pid"], signal.SIGKILL)
    killed = time.time()
    wait_for(lambda: all((w := worker(read_status(run_dir), a["name"]))["waiting_since"]
                         and w["waiting_since"] > killed + 1 for a in actors), 30,
             "every actor asking anew, a second after the kill")
    after = held()
    assert all(len(servers) <= 2 for servers in after.values()), after
    lost_zero = [name for name, servers in before.items() if 0 in servers]
    for name in lost_zero:  # its stand-in (the server may be back and the actor with it)
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert "(lost: port.inference.0)" in log, log
    resent = len(lost_zero)
    wait_for(lambda: last_row(run_dir)["actor/infer_resent"] >= resent, 10,
             "the killed server's actors to send their requests again")
    assert all(row["actor/infer_timeouts"] == 0 for row in read_metrics(run_dir)), \
        "no request waited for its timeout"

