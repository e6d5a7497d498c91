"""The actor worker: steps a ring of environments and streams trajectory chunks.

The ring's S splits take turns: each has at most one inference request in
flight, and while it waits the actor steps whichever split has its answer.
Finished chunks go to the learner on the sample stream; a request unanswered
for `actors.inference_timeout_s` is sent again, to any live inference server.
With `actors.inline_inference` the actor runs the policy itself instead
(actors/inline_policy.py) and never talks to a server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import zmq

from actors.env_ring import ChunkBuilder, EnvSplit, StepResult
from actors.envpool_split import EnvPoolSplit
from actors.envs import EnvSpec, env_seed, env_spec, make_env
from srl_jax.config import ExperimentConfig
from srl_jax.names import NameService
from srl_jax.streams import make_socket, receive, send
from srl_jax.worker import Worker

if TYPE_CHECKING:
    from actors.inline_policy import InlinePolicy

REPLY_KINDS = frozenset({"infer_reply"})
POLL_MS = 100
SEND_WAIT_LOG_S = 5.0
MAX_SENT_RETURNS = 256
"""Episode returns a chunk carries to the learner (which ranks checkpoints by them)."""


class _SplitState:
    """One split's environments, chunk and outstanding request."""

    def __init__(self, index: int, split: EnvSplit | EnvPoolSplit, length: int,
                 spec: EnvSpec) -> None:
        self.index = index
        self.split = split
        self.chunk = ChunkBuilder(length, split.obs, spec.action_shape, spec.action_dtype)
        self.seq = 0
        self.sent_at = 0.0
        self.retry_at = 0.0
        self.delivered = False
        self.request_obs = split.obs


class ActorWorker(Worker):
    kind = "actor"

    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService) -> None:
        super().__init__(config, index, run_dir, names)
        self.env_frames = 0
        self.episodes = 0
        self.chunks_sent = 0
        self.chunks_dropped = 0
        self.infer_timeouts = 0
        self.time_env = 0.0
        self.time_wait = 0.0
        self.time_send = 0.0
        self._next_no_server_log = 0.0
        self.inline: InlinePolicy | None = None
        self._returns: list[float] = []
        self._unsent_returns: list[float] = []
        self._lengths: list[int] = []

    def setup(self) -> None:
        cfg = self.config.actors
        per_split = cfg.envs // cfg.splits
        self.spec = env_spec(self.config.env)
        self.action_low = np.asarray(self.spec.action_low, np.float32)
        self.action_high = np.asarray(self.spec.action_high, np.float32)
        self.splits = []
        for s in range(cfg.splits):
            ids = range(s * per_split, (s + 1) * per_split)
            seeds = [env_seed(self.config.seed, self.index, k) for k in ids]
            if self.config.env.backend == "envpool":  # one C++ batch (seeds seeds[0] + i)
                split = EnvPoolSplit(self.config.env, per_split, seeds[0])
            else:
                split = EnvSplit([make_env(self.config.env) for _ in ids], seeds)
            self.splits.append(_SplitState(s, split, cfg.trajectory_length, self.spec))
        self.samples = make_socket(self.zmq, zmq.PUSH, hwm=cfg.send_queue)
        for i in range(self.config.learner.processes):  # chunks are spread over them
            self.samples.connect(self.lookup(f"learner/samples/{i}"))
        if cfg.inline_inference:
            from actors.inline_policy import InlinePolicy  # imports JAX

            self.inline = InlinePolicy(self, self.spec)
        else:
            self.inference = make_socket(self.zmq, zmq.DEALER)
            self.inference.setsockopt(zmq.IMMEDIATE, 1)
            for i in range(self.config.inference.count):
                self.inference.connect(self.lookup(f"inference/{i}"))
            self.poller = zmq.Poller()
            self.poller.register(self.inference, zmq.POLLIN)
        for state in self.splits:
            self._request(state)

    def _request(self, state: _SplitState, final_obs: np.ndarray | None = None) -> None:
        obs = state.split.obs
        if final_obs is not None and len(final_obs):
            obs = np.concatenate([obs, final_obs.astype(obs.dtype, copy=False)])
        state.request_obs = obs
        if self.inline is None:
            self._send_request(state)
        else:
            state.seq += 1

    def _send_request(self, state: _SplitState) -> None:
        """Send the split's request; with no server connected, try again shortly."""
        state.seq += 1
        state.sent_at = time.monotonic()
        try:
            send(self.inference, "infer_request", {"split": state.index, "seq": state.seq},
                 {"obs": state.request_obs}, flags=zmq.NOBLOCK)
            state.delivered = True
            state.retry_at = state.sent_at + self.config.actors.inference_timeout_s
        except zmq.Again:  # no server connected yet: try again on the next turn of the loop
            state.delivered = False
            state.retry_at = state.sent_at
            if state.sent_at >= self._next_no_server_log:
                self._next_no_server_log = state.sent_at + SEND_WAIT_LOG_S
                self.log.info("waiting for an inference server to connect")

    def run_once(self) -> None:
        if self.inline is not None:
            self._run_inline()
            return
        start = time.perf_counter()
        events = dict(self.poller.poll(POLL_MS))
        self.time_wait += time.perf_counter() - start
        if self.inference in events:
            while (received := receive(self.inference, REPLY_KINDS, self.rejects)) is not None:
                self._on_reply(received[1].meta, received[1].arrays)
        self._resend_overdue()

    def _run_inline(self) -> None:
        """Act for every split in turn with the policy in this process."""
        for state in self.splits:
            start = time.perf_counter()
            meta, arrays = self.inline.act(state.request_obs)
            self.time_wait += time.perf_counter() - start
            self._on_reply({**meta, "split": state.index, "seq": state.seq}, arrays)

    def _resend_overdue(self) -> None:
        now = time.monotonic()
        for state in self.splits:
            if now >= state.retry_at:
                if state.delivered:
                    self.infer_timeouts += 1
                    self.log.warning("split %d: no inference reply for %.1fs; sending again",
                                     state.index, now - state.sent_at)
                self._send_request(state)

    def _on_reply(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        split, seq = meta.get("split"), meta.get("seq")
        if not isinstance(split, int) or not 0 <= split < len(self.splits):
            self.rejects.reject(ValueError(f"reply for unknown split {split!r}"))
            return
        state = self.splits[split]
        if seq != state.seq:
            return  # the answer to a request we already sent again
        rows = len(state.request_obs)
        try:
            action, logp, value = (arrays[k] for k in ("action", "logp", "value"))
        except KeyError as error:
            self.rejects.reject(ValueError(f"reply without array {error}"))
            return
        if not (logp.shape == value.shape == (rows,)
                and action.shape == (rows, *self.spec.action_shape)):
            self.rejects.reject(ValueError(f"reply shapes {action.shape} for {rows} rows"))
            return
        n = len(state.split)
        version = meta.get("version")
        if type(version) is not int:
            self.rejects.reject(ValueError(f"reply with version {version!r}"))
            return
        if not self._valid_actions(action):
            self.rejects.reject(ValueError("reply with actions outside the action space"))
            return
        chunk = state.chunk.on_policy(action[:n], logp[:n], value[:n], version, value[n:])
        if chunk is not None:
            self._send_chunk(chunk)
        start = time.perf_counter()
        result = state.split.step(self._env_actions(action[:n]))
        self.time_env += time.perf_counter() - start
        self._account(result, n)
        state.chunk.on_step(result)
        self._request(state, result.final_obs)

    def _valid_actions(self, action: np.ndarray) -> bool:
        if self.spec.continuous:
            return action.dtype == np.float32 and bool(np.isfinite(action).all())
        return action.dtype.kind in "iu" and bool(
            ((action >= 0) & (action < self.spec.action_dim)).all())

    def _env_actions(self, action: np.ndarray) -> list:
        """What the envs receive: ints, or vectors clipped to the action space."""
        if self.spec.continuous:
            return list(np.clip(action, self.action_low, self.action_high))
        return action.tolist()

    def _account(self, result: StepResult, n: int) -> None:
        self.env_frames += n
        self.episodes += len(result.episode_returns)
        self._returns.extend(result.episode_returns)
        self._lengths.extend(result.episode_lengths)
        self._unsent_returns.extend(result.episode_returns)

    def _send_chunk(self, chunk: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        meta = {"actor": self.index, "episode_returns": self._unsent_returns[-MAX_SENT_RETURNS:]}
        self._unsent_returns = []
        try:
            send(self.samples, "samples", meta, chunk, flags=zmq.NOBLOCK)
            self.chunks_sent += 1
        except zmq.Again:
            if self.config.actors.send_policy == "drop":
                self.chunks_dropped += 1
            else:
                self._send_blocking(meta, chunk, start)
        self.time_send += time.perf_counter() - start

    def _send_blocking(self, meta: dict, chunk: dict[str, np.ndarray], start: float) -> None:
        next_log = start + SEND_WAIT_LOG_S
        while not self.stopping:
            if self.samples.poll(POLL_MS, zmq.POLLOUT):
                try:
                    send(self.samples, "samples", meta, chunk, flags=zmq.NOBLOCK)
                    self.chunks_sent += 1
                    return
                except zmq.Again:
                    continue
            self.heartbeat()
            if time.perf_counter() > next_log:
                self.log.info("waiting %.0fs on the learner: sample stream full",
                              time.perf_counter() - start)
                next_log += SEND_WAIT_LOG_S

    def counters(self) -> dict[str, float]:
        return {
            "env_frames": self.env_frames, "episodes": self.episodes,
            "chunks_sent": self.chunks_sent, "chunks_dropped": self.chunks_dropped,
            "infer_timeouts": self.infer_timeouts, "time_env": self.time_env,
            "time_wait": self.time_wait, "time_send": self.time_send,
        }

    def stats_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"episode_return": np.asarray(self._returns, np.float32),
                  "episode_length": np.asarray(self._lengths, np.int32)}
        self._returns, self._lengths = [], []
        return arrays

    def close(self) -> None:
        for state in getattr(self, "splits", []):
            state.split.close()
        for name in ("inference", "samples"):
            if hasattr(self, name):
                getattr(self, name).close()
        if self.inline is not None:
            self.inline.close()
