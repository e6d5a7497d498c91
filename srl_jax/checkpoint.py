"""Learner checkpoints with orbax: asynchronous, atomic, restored exactly.

A checkpoint is one orbax step under `<run_dir>/checkpoints/<step>/` with two
items: `state`, the learner's TrainState pytree (parameters with their
observation statistics, optimizer state, RNG key, policy version), and
`meta`, JSON with the learner's counters, the save time and the resolved
config. The step is the policy version.

Saves are asynchronous: `save` returns once the arrays are copied off the
devices, and a background thread writes them. Orbax writes into a temporary
directory and renames it when complete, so a kill during a save leaves no
step behind (and the next manager deletes the leftovers). Restores go through
an abstract target built from a live state, so optax's tuples come back as
tuples and arrays land with the live state's shardings. The checkpoint with
the best training return so far is also kept, under `checkpoints/best/`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from srl_jax.run_dir import checkpoint_root


@dataclass(frozen=True)
class Restored:
    step: int
    state: Any
    meta: dict[str, Any]


def _is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _to_saveable(tree: Any) -> Any:
    """Typed PRNG keys become their raw uint32 data; orbax stores plain arrays."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _from_saveable(saved: Any, like: Any) -> Any:
    return jax.tree.map(
        lambda s, x: jax.random.wrap_key_data(s, impl=jax.random.key_impl(x)) if _is_key(x)
        else s, saved, like)


def _manager(directory: Path, keep: int, async_save: bool) -> ocp.CheckpointManager:
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax narrates every step at INFO
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, cleanup_tmp_directories=True,
        create=True)
    return ocp.CheckpointManager(directory.resolve(), options=options)


class Checkpointer:
    """Saves and restores one learner's state; the newest `keep` plus the best."""

    def __init__(self, run_dir: Path, keep: int = 3, keep_best: bool = True,
                 async_save: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self._latest = _manager(checkpoint_root(run_dir), keep, async_save)
        self._best = _manager(checkpoint_root(run_dir, best=True), 1, async_save) \
            if keep_best else None
        self.best_return = -float("inf")
        if self._best is not None and (step := self._best.latest_step()) is not None:
            meta = self._best.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            self.best_return = meta["meta"].get("episode_return_mean", self.best_return)

    def latest_step(self) -> int | None:
        return self._latest.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> float:
        """Start saving `state` as `step`; returns the seconds the caller was held up.

        `meta["episode_return_mean"]`, when given, decides whether this is also
        the new best checkpoint.
        """
        start = time.perf_counter()
        if step == self._latest.latest_step():
            return 0.0
        args = ocp.args.Composite(state=ocp.args.StandardSave(_to_saveable(state)),
                                  meta=ocp.args.JsonSave(meta))
        self._latest.save(step, args=args)
        score = meta.get("episode_return_mean")
        if self._best is not None and score is not None and score > self.best_return:
            self.best_return = score
            self._best.save(step, args=args)
        return time.perf_counter() - start

    def restore(self, like: Any, step: int | None = None, best: bool = False) -> Restored | None:
        """The newest (or given) checkpoint shaped like the live state `like`; None if none."""
        manager = self._best if best else self._latest
        if manager is None:
            return None
        step = manager.latest_step() if step is None else step
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _to_saveable(like))
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return Restored(step, _from_saveable(restored["state"], like), dict(restored["meta"]))

    def wait(self) -> None:
        """Block until every save in flight is on disk."""
        self._latest.wait_until_finished()
        if self._best is not None:
            self._best.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self._latest.close()
        if self._best is not None:
            self._best.close()
