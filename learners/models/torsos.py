"""The torsos every network builds on: dense layers (`mlp_torso`, `MLP`) and the Nature-CNN
(`nature_torso`), made in the calling module so their parameters sit in its tree."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from learners.models.conv import Conv
from learners.models.orthogonal import orthogonal

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


def mlp_torso(x: jax.Array, hidden: Sequence[int], activation: str,
              layer_norm: bool = False) -> jax.Array:
    """Dense layers with orthogonal init (scale sqrt 2), made in the calling module;
    `layer_norm`: a LayerNorm over the inputs and after each activation (MAPPO's MLP)."""
    act = ACTIVATIONS[activation]
    if layer_norm:
        x = nn.LayerNorm()(x)
    for width in hidden:
        x = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)))(x))
        if layer_norm:
            x = nn.LayerNorm()(x)
    return x


def nature_torso(obs: jax.Array, conv: str = "xla",
                 frame_shape: tuple[int, ...] = ()) -> jax.Array:
    """The Nature-DQN torso (Mnih et al. 2015) on [N, H, W, C] frames in 0..255: conv 32
    8x8/4, conv 64 4x4/2, conv 64 3x3/1, dense 512; made in the calling module. `conv`
    is the convolution's implementation (`learners.models.conv.Conv`); both have the same
    parameters. With `frame_shape`, `obs` rows are flat frames of that shape followed by
    one-hot agent ids, which join the 512 features (`EnvSpec.frame_shape`)."""
    init = orthogonal(np.sqrt(2))
    if frame_shape:
        size = int(np.prod(frame_shape))
        ids = obs[:, size:].astype(jnp.float32)
        obs = obs[:, :size].reshape(obs.shape[0], *frame_shape)
    x = obs.astype(jnp.float32) * (1.0 / 255.0)
    x = nn.relu(Conv(32, 8, 4, conv, init, name="Conv_0")(x))
    x = nn.relu(Conv(64, 4, 2, conv, init, name="Conv_1")(x))
    x = nn.relu(Conv(64, 3, 1, conv, init, name="Conv_2")(x))
    x = nn.relu(nn.Dense(512, kernel_init=init)(x.reshape(x.shape[0], -1)))
    return jnp.concatenate([x, ids], -1) if frame_shape else x


class MLP(nn.Module):
    """Hidden layers with orthogonal init (scale sqrt 2), then a linear head."""

    hidden: Sequence[int]
    outputs: int
    head_scale: float
    activation: str = "tanh"
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = mlp_torso(x, self.hidden, self.activation, self.layer_norm)
        return nn.Dense(self.outputs, kernel_init=orthogonal(self.head_scale))(x)
