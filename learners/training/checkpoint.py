"""Learner checkpoints with orbax: asynchronous, atomic, restored exactly.

A checkpoint is one orbax step under `<location>/<step>/`, where `location` is
`checkpoint.dir` (`<run_dir>/checkpoints/` by default, else a path on the learner's
host or a bucket: `srl_jax.config.checkpoint_location`), with two items: `state`, the
learner's TrainState pytree (parameters with their observation statistics,
optimizer state, RNG key, policy version), and
`meta`, JSON with the learner's counters, the save time, the resolved config and the
checkpoint format (`srl_jax.config.checkpoint_location.FORMAT`). The step is the policy
version. Every restore reads the step's meta first and refuses another format with
one line (`CheckpointFormatError`), before orbax compares trees.

Saves are asynchronous: `save` returns once the arrays are copied off the
devices, and a background thread writes them. Orbax writes into a temporary
directory and renames it when complete (in a bucket, which cannot rename, it
adds a commit file last; an s3:// bucket's arrays go through `learners.training.s3_arrays`),
so a kill during a save leaves no step behind (and the
next manager deletes the leftovers). Restores go through
an abstract target built from a live state, so optax's tuples come back as
tuples and arrays land with the live state's shardings.

The checkpoint with the best training return so far is also kept, under
`<location>/best/<step>/`: once its save is complete, its files are
hard-linked there (orbax never rewrites a finished step), which costs the
learner nothing like a second save. A bucket has no hard links: there the
files are copied, commit file last.

Saves hand orbax host numpy arrays, written without OCDBT (one zarr directory
per array). Both keep the save clear of tensorstore's conversion of JSON to
Python objects, which leaks every dict key and value it builds
(`JsonToPyObject` in tensorstore's `python/tensorstore/json_type_caster.cc`
passes new references to `PyDict_SetItem`, which does not steal them):
orbax's `jax.Array` handler calls it twice per save to read tensorstore's
I/O metrics, and OCDBT once per array and twice more to merge: about 30 KB of
Python heap that nothing can free per save of the default experiment's state.
Restores still land on the live state's shardings.

Orbax also runs each save in new threads, and glibc gives new threads malloc
arenas in turn (up to 8 per core): what the saves free stays spread over all of
them, free but resident, and a learner saving every 5 s grew by about 1 MB a
minute that way. Learner processes therefore start with two arenas
(`MALLOC_ARENA_MAX`, set by the controller: `srl_jax.dataflow.worker_kinds`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec.core
import jax
import orbax.checkpoint as ocp
from etils import epath

from learners.training import s3_arrays
from srl_jax.config.checkpoint_location import (
    COMMIT_FILE,
    FORMAT,
    FORMAT_KEY,
    is_bucket,
    steps_in,
)
from srl_jax.config.operations import CheckpointConfig
from srl_jax.config.schema import DEFAULT_POLICY
from srl_jax.runtime.run_dir import checkpoint_root, step_meta

s3_arrays.install()  # before any save or restore in an s3:// bucket


BUCKET_COPIES = 16
"""Files of a step copied at once within a bucket."""


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


def _on_host(tree: Any) -> Any:
    """`tree` as host numpy arrays, which orbax saves without collecting I/O metrics.

    The learner's state is replicated, so every process holds all of it. On CPU these
    may be views of the device buffers: orbax copies them before `save` returns, so
    the next update may donate the buffers.
    """
    return jax.device_get(_to_saveable(tree))


class _NoMergeNotice(logging.Filter):
    """Drops orbax's warning, at every save without OCDBT, that it found nothing to merge."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Skipping merge of OCDBT checkpoints" not in str(record.msg)


def _quiet_orbax() -> None:
    absl = logging.getLogger("absl")
    absl.setLevel(logging.WARNING)  # orbax narrates every step at INFO
    if not any(isinstance(f, _NoMergeNotice) for f in absl.filters):
        absl.addFilter(_NoMergeNotice())


def _handlers(item: str) -> dict[str, ocp.CheckpointHandler]:
    """A step's handlers: the arrays under `item`, without OCDBT, and the JSON `meta`."""
    return {item: ocp.StandardCheckpointHandler(use_ocdbt=False),
            "meta": ocp.JsonCheckpointHandler()}


def _atomicity(directory: epath.Path) -> ocp.options.AtomicityOptions | None:
    """Orbax's commit-file mode in a bucket (its default only for gs://), so that every
    bucket's complete steps look alike (`srl_jax.config.checkpoint_location.steps_in`)."""
    return ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE) \
        if is_bucket(directory) else None


def _drop_torn_steps(directory: epath.Path) -> None:
    """Delete the steps in a bucket that a kill left without their commit file. Not orbax's
    cleanup: in a bucket it deletes every folder without one, `best/`, `evaluated/`, `pool/`
    and the other policies' included."""
    if jax.process_index() == 0 and directory.is_dir():
        for path in directory.iterdir():
            if path.name.isdigit() and not (path / COMMIT_FILE).exists():
                path.rmtree()


def _manager(directory: epath.Path, keep: int, async_save: bool) -> ocp.CheckpointManager:
    _quiet_orbax()
    bucket = is_bucket(directory)
    if bucket:
        _drop_torn_steps(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save,
        cleanup_tmp_directories=not bucket, create=True, atomicity_options=_atomicity(directory))
    return ocp.CheckpointManager(directory, options=options, item_handlers=_handlers("state"))


class Checkpointer:
    """Saves and restores one learner's state; the newest `keep` plus the best."""

    def __init__(self, run_dir: Path, keep: int = 3, keep_best: bool = True,
                 async_save: bool = True, policy: str = DEFAULT_POLICY,
                 location: str = "") -> None:
        """`policy`: whose learner this is (each policy of a run has its own checkpoints).
        `location`: `checkpoint.dir`, where they go ('': `<run_dir>/checkpoints/`)."""
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.location = location
        self._root = checkpoint_root(run_dir, policy=policy, location=location)
        self._best_root = checkpoint_root(run_dir, True, policy, location)
        self._latest = _manager(self._root, keep, async_save)
        self.keep_best = keep_best
        self.best_return = -float("inf")
        self._pending_best: int | None = None
        if keep_best and (best := steps_in(self._best_root)):
            meta = step_meta(self._best_root, best[-1])
            self.best_return = meta.get("episode_return_mean", self.best_return)

    def latest_step(self) -> int | None:
        return self._latest.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> float:
        """Start saving `state` as `step`; returns the seconds the caller was held up.

        `meta["episode_return_mean"]`, when given, decides whether this is also
        the new best checkpoint.
        """
        start = time.perf_counter()
        if self._pending_best is not None:
            # orbax would wait for the previous save here anyway; link it before
            # `keep` can delete it.
            self._latest.wait_until_finished()
            self._promote_best()
        if step == self._latest.latest_step():
            return 0.0
        args = ocp.args.Composite(state=ocp.args.StandardSave(_on_host(state)),
                                  meta=ocp.args.JsonSave(_stamped(meta)))
        self._latest.save(step, args=args)
        score = meta.get("episode_return_mean")
        if self.keep_best and score is not None and score > self.best_return:
            self.best_return, self._pending_best = score, step
        return time.perf_counter() - start

    def _promote_best(self) -> None:
        """Copy the pending best step into `best/` (its save is complete)."""
        if self._pending_best is None or jax.process_index() != 0:
            return
        root, step = self._best_root, str(self._pending_best)
        root.mkdir(parents=True, exist_ok=True)
        _copy_step(self._root / step, root / step)
        for old in steps_in(root):
            if old != self._pending_best:
                (root / str(old)).rmtree()
        self._pending_best = None

    def restore(self, like: Any, step: int | None = None, best: bool = False) -> Restored | None:
        """The newest (or given) checkpoint shaped like the live state `like`; None if none."""
        root = self._best_root if best else self._root
        steps = steps_in(root)
        step = (steps[-1] if steps else None) if step is None else step
        if step is None:
            return None
        if best:
            return read_step(self.run_dir, like, step, True, self.policy, self.location)
        step_meta(root, step)  # another format: one line, not orbax's tree mismatch
        return _restored(step, self._latest.restore(step, args=_restore_args(like)), like)

    def restore_from(self, policy: str, like: Any, at_most: int | None = None) -> Restored | None:
        """The newest complete checkpoint of another policy of the run (a population
        member's donor, under the same location) shaped like `like`, of a step no later
        than `at_most` where given (the version its rank was earned by); None if it has
        none yet."""
        steps = [step for step in steps_in(checkpoint_root(self.run_dir, False, policy,
                                                           self.location))
                 if at_most is None or step <= at_most]
        return read_step(self.run_dir, like, steps[-1], False, policy, self.location) \
            if steps else None

    def wait(self) -> None:
        """Block until every save in flight is on disk (and the best one linked)."""
        self._latest.wait_until_finished()
        self._promote_best()

    def close(self) -> None:
        self.wait()
        self._latest.close()


def _stamped(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with the checkpoint format it is written in."""
    return {**meta, FORMAT_KEY: FORMAT}


def _unstamped(meta: dict[str, Any]) -> dict[str, Any]:
    """A restored `meta` as its writer gave it: the format is the checkpoint's own business,
    checked before anything is restored."""
    return {key: value for key, value in meta.items() if key != FORMAT_KEY}


def _restore_args(like: Any) -> ocp.args.Composite:
    """Restore a state shaped (and sharded) like the live `like`, with its meta."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _to_saveable(like))
    return ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                              meta=ocp.args.JsonRestore())


def _copy_step(source: epath.Path, target: epath.Path) -> None:
    """Copy a complete step to `target` so that no reader sees it half copied: locally
    as hard links, renamed into place; in a bucket by one listing and server-side copies
    (fsspec's, `BUCKET_COPIES` at once), so no byte passes through the learner's host, the
    commit file last. (File by file through epath, each copy a download and an upload
    after two listings, the S3 test's step copies made most of its 6,600 requests.)"""
    if not is_bucket(target):
        linking = target.with_name(f"{target.name}.linking")
        shutil.rmtree(linking, ignore_errors=True)
        shutil.copytree(source, linking, copy_function=os.link)
        linking.rename(target)
        return
    fs, source_key = fsspec.core.url_to_fs(os.fspath(source))
    _, target_key = fsspec.core.url_to_fs(os.fspath(target))
    files = fs.find(source_key)
    commit = f"{source_key}/{COMMIT_FILE}"
    rest = [key for key in files if key != commit]
    fs.copy(rest, [target_key + key[len(source_key):] for key in rest],
            batch_size=BUCKET_COPIES)
    fs.copy(commit, f"{target_key}/{COMMIT_FILE}")


def _absolute(directory: epath.Path | Path) -> epath.Path:
    """`directory` for orbax: a bucket as it is, a local path made absolute."""
    return epath.Path(directory if is_bucket(directory) else os.path.abspath(directory))


def read_step(run_dir: Path, like: Any, step: int, best: bool = False,
              policy: str = DEFAULT_POLICY, location: str = "") -> Restored:
    """One complete step of a learner's checkpoints shaped like `like`, read without a
    `Checkpointer`: opening one cleans up the steps it finds unfinished, and those of a
    learner still running are its saves in flight."""
    return _restored(step, _read(checkpoint_root(run_dir, best, policy, location), step,
                                 _restore_args(like)), like)


def _restored(step: int, restored: Any, like: Any) -> Restored:
    """A restored step's orbax items as the live state's types."""
    return Restored(step, _from_saveable(restored["state"], like), _unstamped(restored["meta"]))


def _read(directory: epath.Path | Path, step: int, args: ocp.args.Composite) -> Any:
    """Restore one step from a directory no manager of ours writes to (another checkpoint
    format: one line, not orbax's tree mismatch). A bare checkpointer reads it (a manager
    reads through one): a read-only manager would log three warnings about its options."""
    step_meta(directory, step)
    directory = _absolute(directory)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler(),
                          atomicity_options=_atomicity(directory)) as checkpointer:
        return checkpointer.restore(directory / str(step), args=args)


def save_params(directory: epath.Path | Path, step: int, params: Any,
                meta: dict[str, Any]) -> None:
    """Save policy parameters alone, as the only step under `directory` (synchronously).

    The evaluator keeps the parameters of its best evaluation this way.
    """
    _quiet_orbax()
    directory = _absolute(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True,
                                           atomicity_options=_atomicity(directory))
    with ocp.CheckpointManager(directory, options=options,
                               item_handlers=_handlers("params")) as manager:
        manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(_on_host(params)),
                                                   meta=ocp.args.JsonSave(_stamped(meta))))
        manager.wait_until_finished()


def restore_params(directory: epath.Path | Path, step: int, like: Any) -> Restored:
    """Parameters saved by `save_params`, shaped like `like`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    restored = _read(directory, step, ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return Restored(step, restored["params"], _unstamped(restored["meta"]))


class SaveSchedule:
    """Says when a save is due, and keeps the record of the saves made."""

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self.saved_step: int | None = None
        """Version of the newest checkpoint made or restored (None: none yet)."""
        self.saves = 0
        self.time_stalled = 0.0
        """Seconds training was held up by saves."""
        self._last_save = time.monotonic()

    def needed(self, version: int) -> bool:
        """Whether `version` is not checkpointed yet."""
        return version != self.saved_step

    def due(self, version: int) -> bool:
        """Whether to checkpoint `version` now."""
        saved = self.saved_step or 0
        if version == saved:
            return False
        by_time = self.config.interval_s > 0 and \
            time.monotonic() - self._last_save >= self.config.interval_s
        by_updates = self.config.every_updates > 0 and \
            version - saved >= self.config.every_updates
        return by_time or by_updates

    def saved(self, version: int, stall_s: float) -> None:
        self.saved_step, self._last_save = version, time.monotonic()
        self.saves += 1
        self.time_stalled += stall_s
