"""A replay server that reanalyses (MuZero Reanalyze, Schrittwieser et al. 2021).

Where the algorithm reanalyses (`Replay.reanalyse` in srl_jax/dataflow/algorithms.py,
MuZero's `reanalyse_fraction`), the replay worker kind runs this subclass
(srl_jax/dataflow/worker_kinds.py picks it). It follows the learner's parameter stream as
an inference server does, and before a sampled batch of positions leaves, it searches again
with the newest parameters from the observations of a random fraction of its rows whose
policy targets the loss reads (MuZero: the K + 1 of an unroll): their search policies
(the policy head's targets) are replaced in the batch and in storage, so that the learner
does not keep fitting what an old model thought. (The value targets bootstrap from the
learner's target network, fresher than any stored search value.) The work rides on
sampling, so the replay's rate limiter paces it as it paces sampling. The search does not
sample at the root: a target is the model's, not a draw's.

Replay servers without reanalysis never import this module, nor JAX.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import zmq

from replay.position_buffer import PositionBuffer
from replay.replay_worker import ReplayWorker
from srl_jax.config.schema import DEFAULT_POLICY, ExperimentConfig
from srl_jax.dataflow.algorithms import reanalyse_fraction, reanalysed_steps
from srl_jax.runtime.worker_base import built
from srl_jax.wire.names import NameService

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX is imported: it searches on CPU

from learners.training.jax_runtime import configure_jax
from policy.acting import make_runner
from policy.param_stream import ParamSubscriber, subscribe
from policy.policy_runner import PolicyRunner, padded_sizes


def reanalyse(runner: PolicyRunner, obs: np.ndarray,
              legal: np.ndarray | None = None) -> np.ndarray:
    """Search from every observation of windows `obs` [n, k, ...], among the `legal`
    actions [n, k, A] where the env masks them, with the runner's parameters: the search
    policies [n, k, A]."""
    n, steps = obs.shape[:2]
    rows = obs.reshape(n * steps, *obs.shape[2:])
    mask = None if legal is None else legal.reshape(n * steps, -1)
    out, _ = runner.run(rows, runner.zero_state(len(rows)), mask)
    return out["search_policy"].reshape(n, steps, -1)


def reanalysed_rows(rows: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Which of a batch's `rows` to reanalyse: a `fraction` of them (the count rounded at
    random, so that the fraction holds on average), drawn at random. Not the first ones:
    the sum tree's stratified draws come back sorted by slot, so the first rows of every
    batch would be the same part of the buffer."""
    count = min(rows, int(fraction * rows + rng.random()))
    return np.sort(rng.choice(rows, count, replace=False))


class ReanalysingReplayWorker(ReplayWorker):
    def __init__(self, config: ExperimentConfig, index: int, run_dir: Path,
                 names: NameService, policy: str = DEFAULT_POLICY) -> None:
        super().__init__(config, index, run_dir, names, policy)
        if not isinstance(self.buffer, PositionBuffer):
            raise TypeError("reanalysis renews sampled positions, which only a PositionBuffer "
                            "keeps")
        self.positions = self.buffer
        """The storage, as the position buffer whose targets reanalysis renews."""
        self.fraction = reanalyse_fraction(config)
        self.steps = reanalysed_steps(config)
        self.rng = np.random.default_rng(self.incarnation.seed(config.seed + 3000 + index))
        self.runner: PolicyRunner | None = None
        self.params: ParamSubscriber | None = None
        self.reanalysed = 0
        self.time_reanalyse = 0.0

    def setup(self) -> None:
        super().setup()
        configure_jax(self.config.runtime)
        steps = self.steps
        most = math.ceil(self.fraction * self.config.learner.batch_envs)
        with self.busy("building the reanalysis search"):
            self.runner = make_runner(self.config, self.spec, self.incarnation.seed(self.index),
                                      steps, most * steps, explore=False)
        # Whole windows, padded to powers of two of them, each compiled when first used:
        # a server mostly sees one count.
        self.runner.sizes = tuple(steps * n for n in padded_sizes(1, most))
        self.params = subscribe(self, self.runner)
        self.poller.register(self.params.socket, zmq.POLLIN)  # wake for new parameters

    def run_once(self) -> None:
        built(self.params, "the parameter subscriber").poll()
        super().run_once()

    def outgoing(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`batch` with the search policies of a random `fraction` of its rows renewed, at
        the leading `steps` of their windows (those the loss reads)."""
        chosen = reanalysed_rows(len(batch["slots"]), self.fraction, self.rng)
        if not len(chosen):
            return batch
        start = time.perf_counter()
        steps = self.steps
        legal = (batch["action_mask"][chosen, :steps].astype(bool) if self.spec.action_masked
                 else None)
        with self.busy("reanalysing"):  # the first search of a size compiles it
            policy = reanalyse(built(self.runner, "the reanalysis runner"),
                               batch["obs"][chosen, :steps], legal)
        self.positions.refresh(batch["slots"][chosen], batch["generations"][chosen], policy)
        batch["search_policy"][chosen, :steps] = policy
        self.reanalysed += len(chosen) * steps
        self.time_reanalyse += time.perf_counter() - start
        return batch

    def counters(self) -> dict[str, float]:
        return {**super().counters(), "reanalysed": self.reanalysed,
                "time_reanalyse": self.time_reanalyse,
                "reanalyse_version": self.runner.version if self.runner else 0}

    def close(self) -> None:
        if self.params is not None:
            self.params.socket.close()
        super().close()
