"""bench.swarm's simulated hosts: what they send is what real workers send, and a host
process stops on SIGTERM (a stopped bench once left them running at full CPU).

The whole bench (controller, host processes, a window) takes about 25 s even at 50
workers, so the suite checks its parts; `python -m bench.swarm --workers 50 --hosts 2
--seconds 3 --churn 0.5` runs it end to end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from actors.actor_worker import awaiting_reply
from bench.harness.machine import CONFIGS_DIR
from bench.simulated.swarm_hosts import Counters, heartbeat_period, waiting
from policy.inference_server import awaiting_requests
from srl_jax.config.loader import config_to_dict, load_config
from srl_jax.config.schema import DEFAULT_POLICY

STARTED_S = 30.0
"""How long the host process may take to import and open its ZMQ context (a busy 2-core
machine); it then waits for a controller that never answers."""


def test_simulated_heartbeats_say_what_real_workers_say_and_their_counters_rise() -> None:
    first, second = waiting("actor", 3, 1000.0), waiting("actor", 3, 1000.5)
    assert first is not None and second is not None
    assert first[0] == second[0] == awaiting_reply(DEFAULT_POLICY, 0.0)[0]
    assert first[1] != second[1], "an actor's oldest request moves every beat"
    served = waiting("inference", 0, 1000.0)
    assert served is not None and served[0] == awaiting_requests(0.0)[0]
    counters = Counters()
    counters.advance()
    before = counters.of("actor")
    counters.advance()
    after = counters.of("actor")
    assert "env_frames" in after and after["env_frames"] > before["env_frames"]


def test_the_period_is_the_configs_stats_interval() -> None:
    config = load_config(CONFIGS_DIR / "cartpole_ppo.yaml", ["runtime.stats_interval_s=0.25"])
    assert heartbeat_period(yaml.safe_dump(config_to_dict(config))) == 0.25


def test_a_host_process_stops_on_sigterm_while_its_agent_waits_for_a_controller(
        tmp_path: Path) -> None:
    nowhere = "tcp://127.0.0.1:9"  # nothing listens: the agent waits, asking again
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.simulated.swarm_hosts", "--names", nowhere,
         "--commands", nowhere, "--events", nowhere, "--hosts", "0", "--run", "test",
         "--servers", "1", "--learners", "1", "--sockets", "64",
         "--out", str(tmp_path / "hosts.json"), "--window", str(tmp_path / "window")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + STARTED_S
        while len(list(Path(f"/proc/{process.pid}/task").iterdir())) < 3:  # ZMQ's threads
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
