"""The policy runner: a compiled acting function on host batches padded to a few sizes.

Socket-free, so it is tested on arrays, and shared by the inference server,
the actors' inline policy and the evaluator. Padding to powers of two means
jit compiles a handful of programs, not one per batch size; `compile` builds
every one of them up front, so the first requests do not wait for XLA. A runner
whose parameters a learner publishes (the inference server's) may start from their
shapes alone: it compiles against them and acts once it has taken the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from learners.models.outputs import Act, unpack_outputs
from learners.models.param_codec import arrays_to_params
from srl_jax.dataflow.env_spec import EnvSpec


def padded_sizes(min_size: int, max_batch: int) -> list[int]:
    """Powers of two from `min_size` up to the first that holds `max_batch`."""
    sizes = [1 << max(0, (min_size - 1).bit_length())]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes


class PolicyRunner:
    """The current policy parameters and their version, and the padded acting call."""

    def __init__(self, act: Act, params: Any, spec: EnvSpec, sizes: Sequence[int],
                 sampling_seed: int) -> None:
        """`params`: version 0, which every worker builds from the seed itself, or only
        their shapes (`jax.ShapeDtypeStruct`s, from `jax.eval_shape`; `act` jitted), where
        a learner publishes them: then it cannot act before `set_params` (`ready`);
        `sizes`: the padded batch sizes (`padded_sizes`)."""
        self.spec = spec
        self.sizes = tuple(sizes)
        self.params = params
        self.template = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype),
                                     params)
        """The parameters' shapes and dtypes, as published parameters must have them."""
        self.ready = not any(isinstance(leaf, jax.ShapeDtypeStruct)
                             for leaf in jax.tree.leaves(params))
        """Whether it holds parameters to act with, not only their shapes."""
        self.version = 0
        self.started_ms = -1
        """The start time of the learner whose parameters it holds (-1: none taken)."""
        self.updates = 0
        self.calls = 0
        self._act = act
        # Action sampling needs speed, not cryptographic quality: the RBG generator
        # costs a fraction of threefry per call on CPU.
        self._key = jax.random.key(sampling_seed, impl="unsafe_rbg")

    def compile(self) -> None:
        """Compile the acting call for every padded size: by a call on zeros, or while it
        holds only the parameters' shapes, ahead of time against them."""
        for size in self.sizes:
            inputs = (np.zeros((size, *self.spec.obs_shape), self.spec.obs_dtype),
                      self.zero_state(size), self.all_legal(size))
            if self.ready:
                self.run(*inputs)
            else:
                self._act.lower(self.template, *inputs, self._key, np.uint32(0)).compile()

    def zero_state(self, rows: int) -> np.ndarray:
        """The recurrent state of `rows` columns at the start of their episodes."""
        return np.zeros((rows, self.spec.state_size), np.float32)

    def all_legal(self, rows: int) -> np.ndarray:
        """Masks of `rows` rows that leave every action legal ([rows, 0] for a policy
        whose env masks nothing)."""
        return np.ones((rows, self.spec.action_dim if self.spec.action_masked else 0), bool)

    def set_params(self, arrays: dict[str, np.ndarray], version: int,
                   started_ms: int = 0) -> None:
        """Take published parameters (named host arrays, as the parameter stream carries
        them) of the learner started at `started_ms`; ValueError if they do not fit this
        policy."""
        self.params = jax.device_put(arrays_to_params(arrays, self.template))
        self.version, self.started_ms = version, started_ms
        self.updates += 1
        self.ready = True

    def wants(self, version: int, started_ms: int = 0) -> bool:
        """Whether parameters of `version`, from the learner started at `started_ms`, are
        newer than what we act with.

        A learner restarted from a checkpoint started later: its versions win even when
        they are lower than those of the learner that died.
        """
        if started_ms != self.started_ms:
            return started_ms > self.started_ms
        return version > self.version or (self.updates == 0 and version == self.version)

    def padded_size(self, rows: int) -> int:
        """The smallest padded size that holds `rows` (doubling past the largest)."""
        for size in self.sizes:
            if rows <= size:
                return size
        size = self.sizes[-1]
        while size < rows:
            size *= 2
        return size

    def run(self, obs: np.ndarray, state: np.ndarray,
            mask: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], int]:
        """{action, logp, value, and for a recurrent policy state} for every row of `obs`
        (acting from `state` [rows, S], among the legal actions `mask` [rows, A] where
        the env masks actions; None: all legal), and the version that made them."""
        rows = obs.shape[0]
        size = self.padded_size(rows)
        batch, states = obs, state
        masks = self.all_legal(rows) if mask is None and size == rows else mask
        if size != rows:
            batch = np.zeros((size, *self.spec.obs_shape), self.spec.obs_dtype)
            batch[:rows] = obs
            states = self.zero_state(size)
            states[:rows] = state
            masks = self.all_legal(size)
            if mask is not None:
                masks[:rows] = mask
        self.calls += 1
        packed = np.asarray(self._act(self.params, batch, states, masks, self._key,
                                      np.uint32(self.calls)))
        return unpack_outputs(packed[:rows], self.spec), self.version
