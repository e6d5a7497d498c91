"""What every worker needs to know about an environment's spaces, without building it.

Env families derive it from a live environment (`actors.envs.env_spec`); learners, servers
and the chunk spec only read it, so it lives here and imports no environment package.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from srl_jax.config.schema import ConfigError, NetworkConfig


@dataclass(frozen=True)
class EnvSpec:
    """An environment's observation and action spaces, as one policy sees them."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_dim: int
    """Number of discrete actions, or the size of a continuous action vector."""
    continuous: bool
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    agents: int = 1
    """Agents of one environment this policy acts for: chunk columns per env."""
    state_size: int = 0
    """Floats of recurrent state the policy keeps per column (`network.core`; 0: none),
    which requests, replies and chunks carry beside the observations (`with_network`)."""
    action_masked: bool = False
    """Whether the env says which actions are legal at each step (a Dict observation's
    `action_mask`, or `infos[agent]["action_mask"]`): requests and chunks then carry
    one bool per action, and illegal actions get probability 0."""
    frame_shape: tuple[int, ...] = ()
    """Where agent ids ride beside observations of more than one axis (an image): their
    own shape. `obs_shape` is then their flattened size plus the `agents` one-hot ids,
    which the network splits again, joining the ids after its convolutions."""
    global_state_size: int = 0
    """Floats of the env's global state (multi-agent envs: `state()`, or every agent's
    observation side by side): what a centralized critic reads. After `with_network`,
    0 unless the network has one (`network.critic: global`), so chunks carry it only then."""
    frame_stack: int = 1
    """Frames an observation stacks on its last axis (Atari's `env.atari.frame_stack`), which
    replay stores once each; 1: observations are not frame stacks."""
    action_values: bool = False
    """A Q policy whose actors compute their transitions' initial priorities
    (`replay.initial_priority: actor`): replies carry every action's value, and chunks
    each step's priority."""
    search_policy: bool = False
    """A policy that acts by search (MuZero): replies carry the search's policy over the
    actions, and chunks each step's, which trains the policy head."""
    final_obs: bool = False
    """Chunks carry the final observation of each step a time limit cut (`final_obs`), for
    a replay learner to bootstrap with its target network (DQN and MuZero on single-agent
    envs without frame stacks; elsewhere the acting policy's value of it,
    `trunc_values`)."""

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one action as actors send it: () for discrete, (dim,) for continuous."""
        return (self.action_dim,) if self.continuous else ()

    @property
    def action_dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.continuous else np.int32)


NATURE_CNN_MIN = 36
"""The smallest frame side the Nature-CNN's three unpadded convolutions (8 stride 4, 4
stride 2, 3 stride 1) leave a pixel of."""


def check_network(kind: str, spec: EnvSpec, env_id: str) -> None:
    """ConfigError if a network of torso `kind` cannot take `env_id`'s spaces (checked
    before launch; the action spaces each network acts in are its own declaration's,
    `srl_jax.dataflow.algorithms.check_spaces`)."""
    if kind == "nature_cnn" and (len(spec.frame_shape or spec.obs_shape) != 3
                                 or spec.continuous):
        actions = "continuous" if spec.continuous else "discrete"
        raise ConfigError(f"'network.kind': 'nature_cnn' needs image observations [H, W, C] and "
                          f"discrete actions; '{env_id}' has observations "
                          f"{list(spec.frame_shape or spec.obs_shape)} and {actions} actions")
    frame = spec.frame_shape or spec.obs_shape
    if kind == "nature_cnn" and min(frame[:2]) < NATURE_CNN_MIN:
        raise ConfigError(f"'network.kind': 'nature_cnn' needs frames of at least "
                          f"{NATURE_CNN_MIN}x{NATURE_CNN_MIN}; '{env_id}' has {list(frame)} "
                          "(use 'mlp')")


def core_state_size(core: str, size: int) -> int:
    """Floats of one column's recurrent state for a `core` of `size` units: an LSTM's cell
    and hidden vectors side by side, a GRU's hidden vector, nothing without a core."""
    return {"none": 0, "lstm": 2 * size, "gru": size}[core]


def with_network(spec: EnvSpec, network: NetworkConfig) -> EnvSpec:
    """`spec` as a policy with `network` sees it: with its core's state size, and the
    global state only for a centralized critic."""
    return dataclasses.replace(
        spec, state_size=core_state_size(network.core, network.core_size),
        global_state_size=spec.global_state_size if network.critic == "global" else 0)
