"""Which published parameters an inference server takes: newest version, newest learner."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from learners.models.param_codec import params_to_arrays
from policy.acting import make_runner
from policy.param_stream import ParamSubscriber
from policy.policy_runner import PolicyRunner
from srl_jax.wire.streams import RejectCounter, make_socket, send
from tests.conftest import make_config, wait_for


@pytest.fixture
def runner() -> PolicyRunner:
    from actors.envs import env_spec

    config = make_config()
    return make_runner(config, env_spec(config.env), sampling_seed=0, min_size=1, max_size=4)


def test_a_restarted_learner_wins_with_lower_versions(runner: PolicyRunner) -> None:
    assert runner.wants(0, started_ms=5)  # nothing taken yet
    runner.set_params(params_to_arrays(runner.params), version=12, started_ms=5)
    assert runner.wants(13, started_ms=5) and not runner.wants(12, started_ms=5)
    assert runner.wants(10, started_ms=6), "a new learner restored at version 10"
    assert not runner.wants(20, started_ms=4), "an older learner's late message"


def test_subscriber_takes_the_newest_learner_and_counts_bad_meta(runner: PolicyRunner) -> None:
    context = zmq.Context.instance()
    pub, sub = make_socket(context, zmq.PUB), make_socket(context, zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub.connect(f"tcp://127.0.0.1:{port}")
    rejects = RejectCounter()
    subscriber = ParamSubscriber(sub, runner, rejects)
    arrays = params_to_arrays(runner.params)
    shifted = {name: value + 1 for name, value in arrays.items()}
    try:
        wait_for(lambda: send(pub, "params", {"version": 1, "started_ms": 1}, arrays) or
                 sub.poll(10), 5, "the subscription")
        subscriber.poll()
        for meta, payload in [({"version": 30, "started_ms": 1}, arrays),
                              ({"version": 4, "started_ms": 2}, shifted),
                              ({"version": 9, "started_ms": "x"}, arrays)]:
            send(pub, "params", meta, payload)
        wait_for(lambda: sub.poll(10) and (subscriber.poll() or runner.started_ms == 2), 5,
                 "the restarted learner's parameters")
        assert (runner.version, runner.started_ms) == (4, 2)
        taken = params_to_arrays(runner.params)
        for name, value in shifted.items():
            np.testing.assert_array_equal(np.asarray(taken[name]), value)
        wait_for(lambda: (subscriber.poll() or True) and rejects.count == 1, 5,
                 "the bad started_ms counted")
    finally:
        pub.close(linger=0)
        sub.close(linger=0)
