"""Acting: the jitted policy, run on host batches padded to a few fixed sizes.

Used by the inference server and by actors in inline-inference mode. Padding
to powers of two means jit compiles a handful of programs, not one per batch
size; every size is compiled up front by `warm_up`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from learners.networks import Policy, init_policy_params, make_policy
from learners.param_codec import arrays_to_params
from srl_jax.config import ExperimentConfig
from srl_jax.env_spec import EnvSpec


def make_act(policy: Policy) -> Callable:
    """(params, obs [N, ...], key, counter) -> (action [N, ...], logp [N], value [N])."""

    def act(params: Any, obs: jax.Array, key: jax.Array, counter: jax.Array) -> tuple:
        out, value = policy.apply(params, obs)
        action = policy.dist.sample(jax.random.fold_in(key, counter), out)
        return action, policy.dist.log_prob(out, action), value

    return jax.jit(act)


def padded_sizes(min_size: int, max_batch: int) -> list[int]:
    """Powers of two from `min_size` up to the first that holds `max_batch`."""
    sizes = [1 << max(0, (min_size - 1).bit_length())]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes


def padded_size(rows: int, sizes: list[int]) -> int:
    """The smallest fixed size that holds `rows` (doubling past the largest)."""
    for size in sizes:
        if rows <= size:
            return size
    size = sizes[-1]
    while size < rows:
        size *= 2
    return size


class PolicyRunner:
    """The current policy parameters and version, and the padded jitted call."""

    def __init__(self, config: ExperimentConfig, spec: EnvSpec, sampling_seed: int,
                 min_size: int, max_size: int) -> None:
        policy, network = make_policy(config, spec)
        self.spec = spec
        self.params = init_policy_params(network, spec.obs_shape, config.seed)
        self.template = jax.tree.map(np.asarray, self.params)
        self.version = 0
        self.incarnation = -1
        self.updates = 0
        self.calls = 0
        self._act = make_act(policy)
        # Action sampling needs speed, not cryptographic quality: the RBG generator
        # costs a fraction of threefry per call on CPU.
        self._key = jax.random.key(sampling_seed, impl="unsafe_rbg")
        self.sizes = padded_sizes(min_size, max_size)

    def warm_up(self) -> None:
        """Compile the policy for every padded size."""
        for size in self.sizes:
            self(np.zeros((size, *self.spec.obs_shape), self.spec.obs_dtype))

    def set_params(self, arrays: dict[str, np.ndarray], version: int,
                   incarnation: int = 0) -> None:
        """Take published parameters; ValueError if they do not fit this policy."""
        self.params = jax.device_put(arrays_to_params(arrays, self.template))
        self.version, self.incarnation = version, incarnation
        self.updates += 1

    def wants(self, version: int, incarnation: int = 0) -> bool:
        """Whether parameters of `version` are newer than what we act with.

        A learner restarted from a checkpoint is a new incarnation: its versions
        win even when they are lower than those of the learner that died.
        """
        if incarnation != self.incarnation:
            return incarnation > self.incarnation
        return version > self.version or (self.updates == 0 and version == self.version)

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(action, logp, value) for every row of `obs`, and the padded size used."""
        rows = obs.shape[0]
        size = padded_size(rows, self.sizes)
        batch = obs
        if size != rows:
            batch = np.zeros((size, *self.spec.obs_shape), self.spec.obs_dtype)
            batch[:rows] = obs
        self.calls += 1
        action, logp, value = jax.device_get(
            self._act(self.params, batch, self._key, np.uint32(self.calls)))
        return action[:rows], logp[:rows], value[:rows], size
