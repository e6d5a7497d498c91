"""Self-play's opponent pools: which versions of a trained policy are kept, and which plays.

The learner of a policy that frozen policies play (`selfplay.opponents`) keeps a
`SnapshotPool` of its own parameters: one snapshot every `selfplay.snapshot_every`
versions (version 0, the seed's parameters, first), the newest `selfplay.pool` of
them. Each snapshot is the parameters as the parameter stream carries them (named
host arrays, `learners/models/param_codec.py`), saved as `<version>.npz` under the
policy's checkpoints, `pool/` (`srl_jax.runtime.run_dir.pool_root`), so that a restarted or
resumed learner keeps its pool. No JAX here: the learner hands in host arrays, and
the actors use `pick_version`.

An actor draws one uniform number per env at each episode start from its own seeded
generator and maps it to a snapshot of the pool it last heard of (`pick_version`):
every snapshot is equally likely, and the episode plays that one to its end.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from etils import epath

SUFFIX = ".npz"


def pick_version(u: float, versions: Sequence[int]) -> int:
    """The snapshot a uniform draw `u` in [0, 1) picks: versions[floor(u * len)]."""
    return versions[min(int(u * len(versions)), len(versions) - 1)]


def nearest_held(version: int, held: Sequence[int]) -> int:
    """The snapshot that acts for a request of `version` (`held` sorted, not empty): that
    one if held, else the newest older one, else the oldest (a request made before the
    pool turned over, or to a server still gathering it)."""
    older = [v for v in held if v <= version]
    return older[-1] if older else held[0]


class SnapshotPool:
    """The newest `size` snapshots of a policy taken every `every` versions, on disk too."""

    def __init__(self, every: int, size: int, directory: epath.Path | None = None) -> None:
        """`directory`: where snapshots are saved and restored from (None: memory only)."""
        self.every = every
        self.size = size
        self.directory = directory
        self.snapshots: dict[int, dict[str, np.ndarray]] = {}
        self._turn = 0

    @property
    def versions(self) -> list[int]:
        """The versions held, oldest first."""
        return sorted(self.snapshots)

    def due(self, version: int) -> bool:
        """Whether `version` is one to keep and not kept yet."""
        return version % self.every == 0 and version not in self.snapshots

    def add(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """Keep `arrays` as snapshot `version` (saved first), dropping the oldest beyond
        `size`."""
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            np.savez(buffer, allow_pickle=False, **arrays)
            partial = self.directory / f"{version}{SUFFIX}.partial"
            partial.write_bytes(buffer.getvalue())
            partial.rename(self.directory / f"{version}{SUFFIX}")
        self.snapshots[version] = arrays
        for old in self.versions[:-self.size]:
            del self.snapshots[old]
            if self.directory is not None:
                (self.directory / f"{old}{SUFFIX}").unlink(missing_ok=True)

    def load(self, up_to: int) -> None:
        """Take the saved snapshots of versions up to `up_to` (the restored learner's),
        the newest `size`; later ones are deleted: the learner makes those versions anew."""
        if self.directory is None or not self.directory.is_dir():
            return
        saved = sorted((int(path.name[:-len(SUFFIX)]), path) for path in self.directory.iterdir()
                       if path.name.endswith(SUFFIX) and path.name[:-len(SUFFIX)].isdigit())
        for version, path in saved:
            if version > up_to:
                path.unlink()
        kept = [(version, path) for version, path in saved if version <= up_to][-self.size:]
        for version, path in kept:
            with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as arrays:
                self.snapshots[version] = {name: arrays[name] for name in arrays.files}

    def next_to_republish(self) -> int | None:
        """The snapshot a republish sends: each in turn, so that a server that joined late
        holds the whole pool after `size` republishes."""
        versions = self.versions
        if not versions:
            return None
        self._turn = (self._turn + 1) % len(versions)
        return versions[self._turn]
