"""Inline inference (SRL's INLINE stream): the actor runs the policy itself, on CPU.

For small networks a round trip to an inference server costs more than the
forward pass. This module is imported only when `actors.inline_inference` is
true, so actors in the normal (remote) mode never import JAX.
"""

from __future__ import annotations

import os

import numpy as np

from srl_jax.config.schema import request_rows
from srl_jax.core.env_spec import EnvSpec

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX is imported: actors act on CPU

from learners.models.policy import make_runner
from learners.training.jax_runtime import configure_jax
from learners.workers.param_stream import subscribe
from srl_jax.core.worker_base import Worker


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

    def act(self, obs: np.ndarray, state: np.ndarray,
            mask: np.ndarray | None = None) -> tuple[dict, dict[str, np.ndarray]]:
        """A reply as an inference server would send it: (meta, arrays)."""
        self.params.poll()
        outputs, version = self.runner.run(obs, state, mask)
        return {"version": version}, outputs

    def close(self) -> None:
        self.params.socket.close()
