"""The learner worker: trains on the sample stream and publishes parameters.

Chunks arrive on the sample stream, are checked against the shapes this run
expects, and wait in a bounded `SampleQueue` that enforces the staleness cap.
Each batch of B env columns goes through one jitted update; the new
parameters are published with the next version number, and re-sent every
`learner.republish_interval_s` so that servers that (re)joined late catch up.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np
import zmq

from actors.envs import env_spec
from learners.jax_runtime import configure_jax
from learners.networks import init_params, make_network
from learners.param_codec import params_to_arrays
from learners.ppo import Batch, init_train_state, make_optimizer, make_update
from learners.sample_queue import SampleQueue
from srl_jax.config import ExperimentConfig
from srl_jax.names import NameService
from srl_jax.streams import bind_registered, make_socket, receive, send
from srl_jax.worker import Worker

SAMPLE_KINDS = frozenset({"samples"})
POLL_MS = 50
MAX_DRAIN = 256


def chunk_layout(config: ExperimentConfig, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array of one actor chunk (see actors/env_ring.py)."""
    T = config.actors.trajectory_length
    n = config.actors.envs // config.actors.splits
    step = ((T, n), np.dtype(np.float32))
    return {
        "obs": ((T + 1, n, *obs_shape), np.dtype(obs_dtype)),
        "actions": ((T, n), np.dtype(np.int32)),
        "logp": step, "values": ((T + 1, n), np.dtype(np.float32)), "rewards": step,
        "terminated": ((T, n), np.dtype(bool)), "truncated": ((T, n), np.dtype(bool)),
        "trunc_values": step, "versions": ((T, n), np.dtype(np.int32)),
    }


def to_batch(arrays: dict[str, np.ndarray]) -> Batch:
    """Host arrays of a [T+1, B] batch as the update's input."""
    fields = {name: arrays[name] for name in Batch._fields}
    fields["terminated"] = fields["terminated"].astype(np.float32)
    fields["truncated"] = fields["truncated"].astype(np.float32)
    return Batch(**fields)


class LearnerWorker(Worker):
    kind = "learner"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService) -> None:
        super().__init__(config, index, run_dir, names)
        cfg = config.learner
        self.queue = SampleQueue(cfg.sample_queue, cfg.batch_envs, cfg.staleness_cap)
        self.version = 0
        self.frames_consumed = 0
        self.lag_sum = 0.0
        self.lag_count = 0
        self.time_update = 0.0
        self.time_publish = 0.0
        self.train_metrics: dict[str, float] = {}
        self._last_publish = 0.0

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        self.pull = make_socket(self.zmq, zmq.PULL, hwm=self.config.learner.sample_queue)
        bind_registered(self.pull, self.names, "learner/samples")
        self.pub = make_socket(self.zmq, zmq.PUB, hwm=4)
        bind_registered(self.pub, self.names, "learner/params")
        spec = env_spec(self.config.env)
        self.layout = chunk_layout(self.config, spec.obs_shape, spec.obs_dtype)
        network = make_network(self.config.network, spec.num_actions)
        ppo = self.config.learner.ppo
        optimizer = make_optimizer(ppo)
        self.state = init_train_state(init_params(network, spec.obs_shape, self.config.seed),
                                      optimizer, self.config.seed)
        example = to_batch(self._example_batch())
        self.update = make_update(network.apply, optimizer, ppo).lower(
            self.state, example).compile()
        self._publish()

    def _example_batch(self) -> dict[str, np.ndarray]:
        B = self.config.learner.batch_envs
        return {name: np.zeros((shape[0], B, *shape[2:]), dtype)
                for name, (shape, dtype) in self.layout.items()}

    def _valid_chunk(self, arrays: dict[str, np.ndarray]) -> bool:
        if arrays.keys() != self.layout.keys():
            self.rejects.reject(ValueError(f"chunk with arrays {sorted(arrays)}"))
            return False
        for name, (shape, dtype) in self.layout.items():
            if arrays[name].shape != shape or arrays[name].dtype != dtype:
                self.rejects.reject(ValueError(
                    f"chunk array {name!r}: {arrays[name].dtype}{list(arrays[name].shape)} "
                    f"where {dtype}{list(shape)} was expected"))
                return False
        return True

    def run_once(self) -> None:
        if self.pull.poll(POLL_MS):
            for _ in range(MAX_DRAIN):
                received = receive(self.pull, SAMPLE_KINDS, self.rejects)
                if received is None:
                    break
                if self._valid_chunk(received[1].arrays):
                    self.queue.put(received[1].arrays, self.version)
        batch = self.queue.take_batch(self.version)
        if batch is not None:
            self._train(batch)
        elif time.monotonic() - self._last_publish > self.config.learner.republish_interval_s:
            self._publish()

    def _train(self, batch: dict[str, np.ndarray]) -> None:
        lag = self.version - batch["versions"]
        self.lag_sum += float(lag.sum())
        self.lag_count += lag.size
        self.frames_consumed += batch["actions"].size
        start = time.perf_counter()
        self.state, metrics = self.update(self.state, to_batch(batch))
        self.train_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.time_update += time.perf_counter() - start
        self.version = int(self.state.version)
        self._publish()

    def _publish(self) -> None:
        start = time.perf_counter()
        arrays = params_to_arrays(self.state.params)
        try:
            send(self.pub, "params", {"version": self.version}, arrays, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.log.debug("parameter stream full; version %d not sent", self.version)
        self._last_publish = time.monotonic()
        self.time_publish += time.perf_counter() - start

    def counters(self) -> dict[str, float]:
        return {
            "learner_steps": self.version, "policy_version": self.version,
            "frames_consumed": self.frames_consumed,
            "samples_dropped_stale": self.queue.dropped_stale,
            "samples_dropped_full": self.queue.dropped_full,
            "queue_chunks": len(self.queue), "lag_sum": self.lag_sum,
            "lag_count": self.lag_count, "time_update": self.time_update,
            "time_publish": self.time_publish,
            **{f"train/{k}": v for k, v in self.train_metrics.items()},
        }

    def close(self) -> None:
        for name in ("pull", "pub"):
            if hasattr(self, name):
                getattr(self, name).close()
