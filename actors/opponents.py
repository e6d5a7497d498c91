"""The actor's side of self-play: which snapshot of an opponent pool each episode plays.

For a frozen policy that plays a pool (`selfplay.opponents`), each env of a split
draws one uniform number from the actor's own seeded generator when its episode
starts and maps it to a snapshot of the pool the policy's server last listed
(`srl_jax.config.opponent_pool.pick_version`); every request row of the env's frozen
agents names that snapshot. The first reply of an episode says which snapshot
acted (a server that does not hold it yet acts with the nearest it does): the
episode keeps that one to its end, and it is what the actor reports
(`opponent_version/<policy>` heartbeat arrays, one entry per episode).
"""

from __future__ import annotations

import numpy as np

from actors.env_ring import StepResult
from srl_jax.config.opponent_pool import pick_version


def ended_envs(results: list[StepResult], agents: list[int]) -> np.ndarray:
    """Indices of a multi-agent split's envs whose episode ended on this step (and have
    begun a new one): every column of every policy is done (`agents`: each policy's
    agents per env; an agent out of play is flagged done until its env resets)."""
    done = [(result.terminated | result.truncated).reshape(-1, n).all(axis=1)
            for result, n in zip(results, agents, strict=True)]
    return np.flatnonzero(np.logical_and.reduce(done))


class OpponentDraws:
    """One split's snapshot per env for a frozen policy's `agents` agents per env."""

    def __init__(self, envs: int, agents: int, rng: np.random.Generator) -> None:
        self.agents = agents
        self.rng = rng
        self.pool = [0]
        """The versions the policy's server last said it holds (version 0 at first)."""
        self.env_versions = np.zeros(envs, np.int64)
        self.requested = np.zeros(envs * agents, np.int64)
        """Per request row (column): the snapshot it plays."""
        self.fresh = np.zeros(envs, bool)
        """Envs whose episode has not had its first reply yet."""
        self.played: list[int] = []
        """The snapshot each episode begun since the last heartbeat plays."""
        self.draw(np.arange(envs))

    def draw(self, envs: np.ndarray) -> None:
        """Pick the snapshots of new episodes in `envs`."""
        if not len(envs):
            return
        self.env_versions[envs] = [pick_version(u, self.pool) for u in self.rng.random(len(envs))]
        self.requested = np.repeat(self.env_versions, self.agents)
        self.fresh[envs] = True

    def take_reply(self, meta: dict, arrays: dict[str, np.ndarray], rows: int) -> str | None:
        """Take a reply's pool and the snapshots that acted; what is wrong with it, or None."""
        pool, acted = meta.get("pool"), arrays.get("opponent")
        if not isinstance(pool, list) or not pool or not all(type(v) is int for v in pool):
            return f"opponent pool reply with pool {pool!r}"
        if acted is None or acted.shape != (rows,) or acted.dtype.kind not in "iu":
            return "opponent pool reply without the snapshot of each row"
        self.pool = sorted(pool)
        if self.fresh.any():
            fresh = np.flatnonzero(self.fresh)
            self.env_versions[fresh] = acted[fresh * self.agents]
            self.requested = np.repeat(self.env_versions, self.agents)
            self.played.extend(self.env_versions[fresh].tolist())
            self.fresh[:] = False
        return None
