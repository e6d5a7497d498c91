"""The inference server: batches actors' observations and answers with actions.

A process shell around a `PolicyRunner` (policy/policy_runner.py, which holds
the parameters and runs the padded policy call): it gathers requests on its end of
the inference stream (`Worker.bind`: its ROUTER socket, and shared memory for the
actors of its host), follows the parameter stream, replies, and reports counters.

Requests from many actors are gathered, whole, until `inference.max_batch`
rows are waiting or `inference.max_wait_ms` has passed since the first one,
padded to the next of a few fixed sizes (powers of two up to the first that
holds `max_batch`, all compiled before serving), and run through one jitted
policy call. A recurrent policy's request carries the state of each of its
rows and its reply the new state: the server keeps none, so any server can
answer any request. A batch never exceeds `max_batch`: a request that would overflow
it is held to start the next batch, served on the next turn whether or not more
requests come; a request larger than `max_batch` is refused (the config check
makes sure actors never send one), and so is one whose observations or state
do not fit the policy (counted in `rejects`), as is one whose legal-action mask
does not match its rows and actions. Each reply carries action,
log-probability, value (and new state) and the parameter version that produced
them. Parameters arrive on the
parameter stream; the newest version wins. The server initialises none: it compiles
the policy against their shapes (`jax.eval_shape`) and answers nothing until the
learner's first arrive (its version 0, published as soon as the learner's state
exists); requests wait for them, queued. A frozen policy's server (self-play) follows
an opponent pool instead, each row acted by the snapshot it names, and waits for the
pool's first snapshot (policy/pool_runner.py); one that plays no pool
builds version 0 from the seed, exactly as a learner would, and acts with it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import zmq

from actors.envs import policy_spec
from learners.training.jax_runtime import configure_jax, device_memory_counters
from policy.acting import make_runner
from policy.param_stream import ParamSubscriber, await_first
from policy.policy_runner import PolicyRunner
from policy.pool_runner import PoolRunner, PoolSubscriber, follow, learner_publishes
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig, request_rows
from srl_jax.dataflow.algorithms import algorithm_config
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.dataflow.shm_layouts import reply_layout, request_layout
from srl_jax.dataflow.stream_table import INFERENCE
from srl_jax.runtime.worker_base import Worker, built
from srl_jax.wire.codec import Message
from srl_jax.wire.names import NameService
from srl_jax.wire.stream_ends import Binder, Origin

POLL_MS = 100

RunnerFactory = Callable[[ExperimentConfig, EnvSpec, int, int, int, bool], PolicyRunner]
"""(config, spec, sampling seed, min padded size, max batch, whether a learner publishes
the parameters) -> an uncompiled runner (`make_runner`)."""


class ReceivedRequest(NamedTuple):
    """An actor's `ActionRequest` as the server took it in: its rows, decoded, and the way
    back to the split that sent it."""

    origin: Origin
    """Where it came from, to answer it along the same route."""
    meta: dict
    obs: np.ndarray
    state: np.ndarray
    """[rows, S] recurrent state of the rows (S = 0 without a core)."""
    mask: np.ndarray
    """[rows, A] legal actions of the rows (A = 0 where the env masks nothing)."""
    opponent: np.ndarray | None = None
    """A frozen policy's: [rows] the snapshot of its opponent pool each row plays."""


def awaiting_requests(last_batch_wall: float) -> tuple[str, float]:
    """What a serving inference server's heartbeat says it waits on, since its last batch
    (bench/simulated/swarm_hosts.py sends the same)."""
    return "requests from actors", last_batch_wall


class InferenceServer(Worker):
    kind = "inference"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY,
                 runner_factory: RunnerFactory = make_runner) -> None:
        """`runner_factory`: how `setup` builds the policy runner (a benchmark passes
        one that acts without JAX, to measure the server's own work)."""
        super().__init__(config, index, run_dir, names, policy)
        self.runner_factory = runner_factory
        self.requests = 0
        self.rows = 0
        self.batches = 0
        self.padded_rows = 0
        self.time_compute = 0.0
        self.search_depth_sum = 0.0
        self.simulations = 0
        """Simulations per row searched, where the policy acts by search (else 0)."""
        self._runner: PolicyRunner | None = None
        self._inference: Binder | None = None
        """Its end of the inference stream, once `setup` has bound it."""
        self.params: ParamSubscriber | PoolSubscriber | None = None
        """None for a frozen policy without an opponent pool: it acts with version 0."""
        self.pool: PoolRunner | None = None
        """A frozen policy's opponent pool (policy/pool_runner.py)."""
        self.poller = zmq.Poller()
        self._held: ReceivedRequest | None = None
        """A request that would have overflowed the last batch: it starts the next."""
        self._split_rows = 1
        """The rows of most requests: a split's columns (set with the policy)."""
        self._last_batch_wall = time.time()
        self._no_state = np.zeros((config.inference.max_batch, 0), np.float32)
        """The empty state of rows of a policy without a core (shared, never written)."""
        self._no_mask = np.zeros((config.inference.max_batch, 0), bool)
        """The empty masks of rows of a policy whose env masks no action."""

    @property
    def runner(self) -> PolicyRunner:
        return built(self._runner, "the policy runner")

    @property
    def inference(self) -> Binder:
        return built(self._inference, "the inference stream's end")

    def setup(self) -> None:
        configure_jax(self.config.runtime)
        spec = policy_spec(self.config, self.policy)
        cfg = self.config.inference
        # Initialising parameters from the seed (where no learner publishes them) is XLA
        # work that can outlast a heartbeat timeout on a loaded CPU (a Nature-CNN).
        with self.busy("building the policy"):
            self._runner = self.runner_factory(
                self.config, spec, self.incarnation.seed(self.config.seed + 1000 + self.index),
                cfg.min_padded_batch, cfg.max_batch, learner_publishes(self.config, self.policy))
        self.pool, self.params = follow(self, self.runner)  # what is published meanwhile waits
        with self.busy("compiling the policy"):
            self.runner.compile()
        if spec.search_policy:
            self.simulations = algorithm_config(self.config).simulations
        self._split_rows = request_rows(self.config.actors, spec.agents) // 2
        self._inference = self.bind(INFERENCE, [request_layout(self.config, spec, self.policy),
                                                reply_layout(self.config, spec, self.policy)],
                                    hwm=cfg.request_queue)
        self.inference.register(self.poller)
        if self.params is not None:
            self.poller.register(self.params.socket, zmq.POLLIN)
            await_first(self.params, math.inf, self.keep_alive)  # requests queue until then

    def run_once(self) -> None:
        # A held request is served now, with what else comes within max_wait.
        ready = self._held or self.inference.pending
        events = dict(self.poller.poll(0 if ready else POLL_MS))
        if self.params is not None and self.params.socket in events:
            self.params.poll()
        if ready or self.inference.ready(events):
            self._serve()

    def _receive(self, rows: int) -> tuple[Origin, Message] | None:
        """The next request; no more records are taken from the doorbell than a batch of
        `rows` has room for (at a split's columns a request: one that ends episodes by a
        time limit carries twice as many), so the others stay there for an idle peer."""
        room = self.config.inference.max_batch - rows
        return self.inference.receive(limit=max(1, room // self._split_rows))

    def _gather(self) -> list[ReceivedRequest]:
        """Whole requests, the held one first, until the next would overflow max_batch
        (it is held for the next batch), max_batch rows are waiting, or max_wait has
        passed since the first."""
        cfg = self.config.inference
        self.inference.rotate()
        pending = [self._held] if self._held else []
        rows = sum(request.obs.shape[0] for request in pending)
        self._held = None
        deadline = None
        while rows < cfg.max_batch:
            received = self._receive(rows)
            if received is None:
                if not pending:
                    if not self.inference.wait(0):
                        return pending
                    continue
                deadline = deadline or time.perf_counter() + cfg.max_wait_ms / 1000
                remaining_ms = (deadline - time.perf_counter()) * 1000
                # zmq polls in whole milliseconds and truncates: round up, or a wait
                # under 1 ms (the default max_wait_ms) would never wait at all.
                if remaining_ms <= 0 or not self.inference.wait(math.ceil(remaining_ms)):
                    break
                continue
            origin, message = received
            request = self._checked(origin, message.meta, message.arrays)
            if request is None:
                self.inference.release(origin)
                continue
            obs = request.obs
            if rows + obs.shape[0] > cfg.max_batch:
                self._held = request
                break
            pending.append(request)
            rows += obs.shape[0]
        return pending

    def _checked(self, origin: Origin, meta: dict,
                 arrays: dict[str, np.ndarray]) -> ReceivedRequest | None:
        """The request, if its observations and state fit the policy; else None, counted
        in `rejects`."""
        obs, state = arrays.get("obs"), arrays.get("state")
        spec = self.runner.spec
        if (obs is None or obs.shape[1:] != spec.obs_shape or obs.dtype != spec.obs_dtype
                or obs.ndim != 1 + len(spec.obs_shape)
                or not 1 <= obs.shape[0] <= self.config.inference.max_batch):
            self.rejects.reject(ValueError(f"request obs of shape "
                                           f"{None if obs is None else obs.shape}"))
            return None
        rows = obs.shape[0]
        if state is None and not spec.state_size:
            state = self._no_state[:rows]
        if state is None or state.shape != (rows, spec.state_size) or state.dtype != np.float32:
            self.rejects.reject(ValueError(
                f"request state {None if state is None else (state.shape, str(state.dtype))} "
                f"for {rows} rows of a policy with state size {spec.state_size} (float32)"))
            return None
        mask, width = arrays.get("action_mask"), spec.action_dim if spec.action_masked else 0
        if mask is None and not width:
            mask = self._no_mask[:rows]
        elif mask is None or mask.shape != (rows, width) or mask.dtype != bool:
            self.rejects.reject(ValueError(
                f"request action_mask {None if mask is None else (mask.shape, str(mask.dtype))} "
                f"for {rows} rows of a policy with {width} masked actions (bool)"))
            return None
        opponent = arrays.get("opponent")
        if self.pool is not None and (opponent is None or opponent.shape != (rows,)
                                      or opponent.dtype != np.int64):
            self.rejects.reject(ValueError(f"request to an opponent pool without opponent "
                                           f"[{rows}] int64"))
            return None
        return ReceivedRequest(origin, meta, obs, state, mask, opponent)

    def _serve(self) -> None:
        """Answer one batch of waiting requests."""
        if pending := self._gather():
            self._last_batch_wall = time.time()
            batch = np.concatenate([request.obs for request in pending])
            states = np.concatenate([request.state for request in pending])
            masks = np.concatenate([request.mask for request in pending])
            rows = batch.shape[0]
            start = time.perf_counter()
            if self.pool is None:
                outputs, version = self.runner.run(batch, states, masks)
            else:
                outputs, version = self.pool.run(batch, states, masks, np.concatenate(
                    [request.opponent for request in pending]))
            self.time_compute += time.perf_counter() - start
            if "search_depth" in outputs:
                self.search_depth_sum += float(outputs.pop("search_depth").sum())
            self.batches += 1
            self.requests += len(pending)
            self.rows += rows
            self.padded_rows += self.runner.padded_size(rows)
            offset = 0
            for origin, meta, obs, *_ in pending:
                part = slice(offset, offset + obs.shape[0])
                offset = part.stop
                reply_meta = {"split": meta.get("split"), "seq": meta.get("seq"),
                              "version": version, "batch_rows": rows}
                if self.pool is not None:
                    reply_meta["pool"] = self.pool.versions
                self.inference.reply(origin, reply_meta,
                                     {name: out[part] for name, out in outputs.items()})

    def waiting(self) -> tuple[str, float] | None:
        """The policy's first parameters, then requests from actors (since the last batch)."""
        if self._inference is None:
            return super().waiting()
        if self.params is not None and not self.params.taken:
            return f"the first parameters of policy '{self.policy}'", self._last_batch_wall
        return awaiting_requests(self._last_batch_wall)

    def counters(self) -> dict[str, float]:
        return {
            "requests": self.requests, "rows": self.rows, "batches": self.batches,
            "padded_rows": self.padded_rows, "time_compute": self.time_compute,
            "param_updates": self._runner.updates if self._runner else 0,
            "policy_version": self._runner.version if self._runner else 0,
            **self.shm_counters(),
            **device_memory_counters(), **self._search_counters(),
        }

    def _search_counters(self) -> dict[str, float]:
        """A policy that acts by search: its simulations and the depth its searches reach."""
        if not self.simulations:
            return {}
        return {"simulations": self.rows * self.simulations,
                "search_depth_sum": self.search_depth_sum}

    def close(self) -> None:
        if self._inference is not None:
            self._inference.close()
        if self.params is not None:
            self.params.socket.close()
