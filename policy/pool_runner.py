"""A frozen policy's inference: the opponent pool on the device, each row acted by its snapshot.

A frozen policy (`selfplay.frozen`) has inference servers but no learner. One that
plays a trained policy's snapshots (`selfplay.opponents`) follows that policy's
pool stream instead of a parameter stream: `PoolRunner` holds every snapshot the
pool lists, and each request row names the snapshot its episode plays
(`opponent`, picked by the actor). Rows are grouped by snapshot and each group runs
through the server's `PolicyRunner` with that snapshot's parameters; the reply says
which snapshot acted for each row. The server builds no parameters of its own: it
answers once the pool's first snapshot has come; a row asking for a snapshot it does
not hold is acted by the nearest it does (`srl_jax.config.opponent_pool.nearest_held`).
A frozen policy without an opponent entry follows nothing and acts with version 0, the
seed's parameters, forever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import zmq

from learners.models.param_codec import arrays_to_params
from policy.param_stream import ParamSubscriber, subscribe
from policy.policy_runner import PolicyRunner
from srl_jax.config.opponent_pool import nearest_held
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.stream_table import POOL
from srl_jax.wire.streams import RejectCounter, receive

if TYPE_CHECKING:
    from srl_jax.runtime.worker_base import Worker


class PoolRunner:
    """The snapshots of an opponent pool by version, acting through one `PolicyRunner`."""

    def __init__(self, runner: PolicyRunner) -> None:
        """`runner`: the policy's, which may hold only the parameters' shapes; snapshots come
        from the pool stream (`take`)."""
        self.runner = runner
        self.snapshots: dict[int, Any] = {}
        self.started_ms = -1
        self.updates = 0

    @property
    def versions(self) -> list[int]:
        """The snapshots held, oldest first (one at least, once the first is taken)."""
        return sorted(self.snapshots)

    def take(self, version: int, started_ms: int, pool: list[int],
             arrays: dict[str, np.ndarray]) -> None:
        """Hold snapshot `version` of the learner started at `started_ms` whose pool lists
        `pool`, and drop those it no longer lists; an earlier learner's is ignored.
        ValueError if the arrays do not fit the policy."""
        if started_ms < self.started_ms:
            return
        if version not in pool:
            raise ValueError(f"snapshot {version} not in its pool {pool}")
        params = jax.device_put(arrays_to_params(arrays, self.runner.template))
        self.started_ms = started_ms
        self.snapshots[version] = params
        for held in [v for v in self.snapshots if v not in pool]:
            del self.snapshots[held]
        self.updates += 1

    def run(self, obs: np.ndarray, state: np.ndarray, mask: np.ndarray, requested: np.ndarray
            ) -> tuple[dict[str, np.ndarray], int]:
        """The runner's outputs for every row (`PolicyRunner.run`), each acted by the
        snapshot it asks for (`requested`, or the nearest held), with `opponent` [rows],
        the snapshot that acted; and the newest version held."""
        held = self.versions
        acted = requested.copy()
        for version in np.unique(requested).tolist():
            acted[requested == version] = nearest_held(version, held)
        groups = np.unique(acted).tolist()
        if len(groups) == 1:
            self.runner.params = self.snapshots[groups[0]]
            outputs, _ = self.runner.run(obs, state, mask)
        else:
            outputs = {}
            for version in groups:
                rows = np.flatnonzero(acted == version)
                self.runner.params = self.snapshots[version]
                part, _ = self.runner.run(obs[rows], state[rows], mask[rows])
                for name, values in part.items():
                    if name not in outputs:
                        outputs[name] = np.empty((len(obs), *values.shape[1:]), values.dtype)
                    outputs[name][rows] = values
        return {**outputs, "opponent": acted}, held[-1]


class PoolSubscriber:
    """Feeds a `PoolRunner` from a SUB socket connected to the trained policy's learner."""

    def __init__(self, socket: zmq.Socket, pool: PoolRunner, rejects: RejectCounter) -> None:
        self.socket = socket
        self.pool = pool
        self.rejects = rejects

    @property
    def taken(self) -> bool:
        return self.pool.updates > 0

    def poll(self) -> None:
        """Take every waiting snapshot."""
        while (received := receive(self.socket, POOL.connecter_receives,
                                   self.rejects)) is not None:
            meta = received[1].meta
            version, started_ms, pool = (meta.get(k) for k in ("version", "started_ms", "pool"))
            if type(version) is not int or type(started_ms) is not int \
                    or not isinstance(pool, list) or not all(type(v) is int for v in pool):
                self.rejects.reject(ValueError("snapshot without integer version, started_ms "
                                               "and pool"))
                continue
            try:
                self.pool.take(version, started_ms, pool, received[1].arrays)
            except ValueError as error:
                self.rejects.reject(error)


def learner_publishes(config: ExperimentConfig, policy: str) -> bool:
    """Whether a learner sends `policy`'s servers its parameters: a trained policy's own,
    a frozen one's opponent pool; a frozen policy without one acts with the seed's."""
    return policy not in config.selfplay.frozen or policy in config.selfplay.opponents


def follow(worker: Worker, runner: PolicyRunner
           ) -> tuple[PoolRunner | None, ParamSubscriber | PoolSubscriber | None]:
    """What an inference server of `worker.policy` acts with and listens to: a trained
    policy's parameter stream; a frozen policy's opponent pool (a `PoolRunner` over
    `runner`, fed by its source's pool stream); or, frozen without a pool, nothing."""
    if not learner_publishes(worker.config, worker.policy):
        return None, None
    source = worker.config.selfplay.opponents.get(worker.policy)
    if source is None:
        return None, subscribe(worker, runner)
    pool = PoolRunner(runner)
    socket = worker.socket(POOL, source, hwm=worker.config.learner.param_queue)
    return pool, PoolSubscriber(socket, pool, worker.rejects)
