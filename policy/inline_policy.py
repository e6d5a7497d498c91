"""Inline inference (SRL's INLINE stream): the actor runs the policy itself, on CPU.

For small networks a round trip to an inference server costs more than the
forward pass. With `actors.inline_inference` the actor worker kind runs
`InlineActorWorker` (srl_jax/dataflow/worker_kinds.py picks it), the actor shell with
the policy in its own process instead of inference sockets; actors in the normal
(remote) mode never import this module, nor JAX.
"""

from __future__ import annotations

import os
import time

import numpy as np

from actors.actor_core import ActionRequest
from actors.actor_worker import ActorWorker
from srl_jax.config.schema import request_rows
from srl_jax.dataflow.env_spec import EnvSpec

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX is imported: actors act on CPU

from learners.training.jax_runtime import configure_jax
from policy.acting import make_runner
from policy.param_stream import subscribe
from srl_jax.runtime.worker_base import Worker, built


class InlinePolicy:
    """The latest published policy, evaluated in the actor's own process."""

    def __init__(self, worker: Worker, spec: EnvSpec) -> None:
        config = worker.config
        configure_jax(config.runtime)
        # From a split's rows up to those of its largest request, all compiled here; the
        # parameters' initialisation is XLA work too, so it counts as busy as well.
        with worker.busy("building and compiling the policy"):
            self.runner = make_runner(config, spec,
                                      worker.incarnation.seed(config.seed + 2000 + worker.index),
                                      min_size=config.actors.envs // config.actors.splits,
                                      max_size=request_rows(config.actors))
            self.runner.compile()
        self.params = subscribe(worker, self.runner)

    def act(self, request: ActionRequest) -> tuple[dict, dict[str, np.ndarray]]:
        """The reply to `request` as an inference server would send it: (meta, arrays)."""
        self.params.poll()
        obs = request.arrays["obs"]
        state = request.arrays.get("state")
        outputs, version = self.runner.run(
            obs, self.runner.zero_state(len(obs)) if state is None else state,
            request.arrays.get("action_mask"))
        return {**request.meta, "version": version}, outputs

    def close(self) -> None:
        self.params.socket.close()


class InlineActorWorker(ActorWorker):
    """An actor that answers its own requests with `InlinePolicy` (a single-agent env's)."""

    inline: InlinePolicy | None = None

    def _connect_inference(self) -> None:
        self.inline = InlinePolicy(self, self.core.specs[0])

    def _send_request(self, request: ActionRequest) -> None:
        """Nothing to send: `run_once` answers each split's newest request."""

    def run_once(self) -> None:
        """Act for every split in turn."""
        inline = built(self.inline, "the inline policy")
        for split in range(len(self.core.splits)):
            start = time.perf_counter()
            meta, arrays = inline.act(self.core.latest(split))
            self.time_wait += time.perf_counter() - start
            self._on_reply(0, meta, arrays)

    def waiting(self) -> tuple[str, float] | None:
        """Once the policy is built, only a blocked send: no request waits on a server."""
        return super().waiting() if self.inline is None else self.blocked_send()

    def close(self) -> None:
        super().close()
        if self.inline is not None:
            self.inline.close()
