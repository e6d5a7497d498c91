"""The inference server: batches actors' observations and answers with actions.

Requests from many actors are gathered until `inference.max_batch` rows are
waiting or `inference.max_wait_ms` has passed since the first one, padded to
the next of a few fixed sizes (powers of two), and run through one jitted
policy call. Each reply carries action, log-probability, value and the
parameter version that produced them. Parameters arrive on the parameter
stream; the newest version wins. Until the first arrives, the server acts with
version 0, which it builds from the seed exactly as the learner does.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np
import zmq

from actors.envs import env_spec
from learners.jax_runtime import configure_jax
from learners.networks import init_policy_params, make_policy
from learners.param_codec import arrays_to_params
from learners.policy import make_act
from srl_jax.config import ExperimentConfig
from srl_jax.names import NameService
from srl_jax.streams import bind_registered, make_socket, receive, send
from srl_jax.worker import Worker

REQUEST_KINDS = frozenset({"infer_request"})
PARAM_KINDS = frozenset({"params"})
POLL_MS = 100
FIRST_PARAMS_WAIT_S = 3.0


def padded_sizes(min_size: int, max_batch: int) -> list[int]:
    """Powers of two from `min_size` up to the first that holds `max_batch`."""
    sizes = [1 << max(0, (min_size - 1).bit_length())]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes


def padded_size(rows: int, sizes: list[int]) -> int:
    """The smallest fixed size that holds `rows` (doubling past the largest)."""
    for size in sizes:
        if rows <= size:
            return size
    size = sizes[-1]
    while size < rows:
        size *= 2
    return size


class InferenceServer(Worker):
    kind = "inference"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService) -> None:
        super().__init__(config, index, run_dir, names)
        self.requests = 0
        self.rows = 0
        self.batches = 0
        self.padded_rows = 0
        self.param_updates = 0
        self.time_compute = 0.0
        self.version = 0

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        spec = env_spec(self.config.env)
        self.obs_shape, self.obs_dtype = spec.obs_shape, spec.obs_dtype
        policy, network = make_policy(self.config, spec)
        self.params = init_policy_params(network, spec.obs_shape, self.config.seed)
        self.template = jax.tree.map(np.asarray, self.params)
        self.act = make_act(policy)
        # Action sampling needs speed, not cryptographic quality: the counter-free
        # RBG generator costs a fraction of threefry per call on CPU.
        self.key = jax.random.key(self.config.seed + 1000 + self.index, impl="unsafe_rbg")
        self.sizes = padded_sizes(self.config.inference.min_padded_batch,
                                  self.config.inference.max_batch)
        self._warm_up()
        self.router = make_socket(self.zmq, zmq.ROUTER)
        bind_registered(self.router, self.names, f"inference/{self.index}")
        self.param_sub = make_socket(self.zmq, zmq.SUB)
        self.param_sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.param_sub.setsockopt(zmq.RCVHWM, 4)
        self.param_sub.connect(self.lookup("learner/params"))
        self._await_first_params()
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.param_sub, zmq.POLLIN)

    def _await_first_params(self) -> None:
        """Take the learner's current parameters before serving, if they come soon.

        A server restarted mid-run would otherwise act with version 0 until the
        next republish, and its samples would all be dropped as stale.
        """
        deadline = time.monotonic() + FIRST_PARAMS_WAIT_S
        while self.version == 0 and time.monotonic() < deadline and not self.stopping:
            if self.param_sub.poll(POLL_MS):
                self._take_newest_params()
                if self.param_updates:
                    return
            self.heartbeat()

    def _warm_up(self) -> None:
        """Compile the policy for every padded size before taking requests."""
        for size in self.sizes:
            obs = np.zeros((size, *self.obs_shape), self.obs_dtype)
            jax.block_until_ready(self.act(self.params, obs, self.key, np.uint32(0)))

    def run_once(self) -> None:
        events = dict(self.poller.poll(POLL_MS))
        if self.param_sub in events:
            self._take_newest_params()
        if self.router in events:
            self._serve()

    def _take_newest_params(self) -> None:
        newest = None
        oldest_wanted = self.version + 1 if self.param_updates else self.version
        while (received := receive(self.param_sub, PARAM_KINDS, self.rejects)) is not None:
            message = received[1]
            version = message.meta.get("version")
            if type(version) is int and version >= oldest_wanted and (
                    newest is None or version > newest.meta["version"]):
                newest = message
        if newest is None:
            return
        try:
            params = arrays_to_params(newest.arrays, self.template)
        except ValueError as error:
            self.rejects.reject(error)
            return
        self.params = jax.device_put(params)
        self.version = newest.meta["version"]
        self.param_updates += 1

    def _gather(self) -> list[tuple[list[bytes], dict, np.ndarray]]:
        """Requests until max_batch rows are waiting or max_wait has passed."""
        cfg = self.config.inference
        pending, rows = [], 0
        deadline = None
        while rows < cfg.max_batch:
            received = receive(self.router, REQUEST_KINDS, self.rejects, envelope=1)
            if received is None:
                if not pending:
                    if self.router.poll(0) == 0:
                        return pending
                    continue
                deadline = deadline or time.perf_counter() + cfg.max_wait_ms / 1000
                remaining = deadline - time.perf_counter()
                if remaining <= 0 or self.router.poll(remaining * 1000) == 0:
                    break
                continue
            routing, message = received
            obs = message.arrays.get("obs")
            if (obs is None or obs.ndim != 1 + len(self.obs_shape)
                    or obs.shape[1:] != self.obs_shape or obs.shape[0] == 0):
                self.rejects.reject(ValueError(f"request obs of shape "
                                               f"{None if obs is None else obs.shape}"))
                continue
            pending.append((routing, message.meta, obs))
            rows += obs.shape[0]
        return pending

    def _serve(self) -> None:
        """Answer one batch of waiting requests."""
        if pending := self._gather():
            rows = sum(obs.shape[0] for _, _, obs in pending)
            size = padded_size(rows, self.sizes)
            batch = np.zeros((size, *self.obs_shape), self.obs_dtype)
            np.concatenate([obs for _, _, obs in pending], out=batch[:rows], casting="unsafe")
            start = time.perf_counter()
            action, logp, value = (np.asarray(x) for x in self.act(
                self.params, batch, self.key, np.uint32(self.batches)))
            self.time_compute += time.perf_counter() - start
            self.batches += 1
            self.requests += len(pending)
            self.rows += rows
            self.padded_rows += size
            offset = 0
            for routing, meta, obs in pending:
                part = slice(offset, offset + obs.shape[0])
                offset = part.stop
                reply_meta = {"split": meta.get("split"), "seq": meta.get("seq"),
                              "version": self.version, "batch_rows": rows}
                send(self.router, "infer_reply", reply_meta,
                     {"action": action[part], "logp": logp[part], "value": value[part]},
                     routing=routing)

    def counters(self) -> dict[str, float]:
        return {
            "requests": self.requests, "rows": self.rows, "batches": self.batches,
            "padded_rows": self.padded_rows, "param_updates": self.param_updates,
            "time_compute": self.time_compute, "policy_version": self.version,
        }

    def close(self) -> None:
        for name in ("router", "param_sub"):
            if hasattr(self, name):
                getattr(self, name).close()
