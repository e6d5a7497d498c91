"""Convolutions that stay fast on XLA:CPU, with the parameters of `flax.linen.Conv`.

XLA:CPU runs a convolution on its Eigen path, single-threaded for these shapes and
slow for a strided kernel (the Nature-CNN's 8x8/4 first layer: about 4x torch's
time). Inside the learner's update it is worse: the weight gradients of convolutions
in a `lax.scan` body fall back to a naive emitter (JAX issue 12868), and even written
out unrolled, the 3x3 layer's gradients took 125 ms of a 690 ms update. Matmuls and
elementwise sums are XLA:CPU's fast, multi-threaded paths, forward and backward, so:
- a VALID convolution whose kernel size is a multiple of its stride is space-to-depth
  by the stride, then a stride-1 convolution with a kernel of k/s over s*s*C channels,
  computed as one matmul from every position to every kernel offset's output summed
  over shifted windows (`matmul_conv`);
- a stride-1 convolution is im2col, the k*k shifted windows side by side, and one
  matmul (`patches_matmul_conv`; on the 9x9 maps it sees, cheaper than the shifted sum).
`python -m bench.learner --levers` measures the update with either implementation beside torch.

`Conv` keeps `flax.linen.Conv`'s parameters ("kernel" [k, k, C, F], "bias" [F], the
same names and shapes), so a checkpoint moves between platforms whatever each chose.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def conv_impl(setting: str) -> str:
    """The convolution `network.conv` asks for on the platform JAX runs on here."""
    if setting == "auto":
        return "matmul" if jax.default_backend() == "cpu" else "xla"
    return setting


def space_to_depth(x: jax.Array, block: int) -> jax.Array:
    """[N, H, W, C] -> [N, H/b, W/b, b*b*C], each b x b patch in one position's
    channels (row, column, channel order); H and W must be multiples of b."""
    n, h, w, c = x.shape
    x = x.reshape(n, h // block, block, w // block, block, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h // block, w // block, block * block * c)


def kernel_to_depth(kernel: jax.Array, block: int) -> jax.Array:
    """The [k, k, C, F] kernel that, on `space_to_depth(x, block)` with stride 1, does
    what `kernel` does on x with stride `block`: [k/b, k/b, b*b*C, F]."""
    k, _, c, f = kernel.shape
    kb = k // block
    kernel = kernel.reshape(kb, block, kb, block, c, f).transpose(0, 2, 1, 3, 4, 5)
    return kernel.reshape(kb, kb, block * block * c, f)


def shifted_matmul_conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """A stride-1 VALID convolution as one matmul to every kernel offset's output,
    then the sum of each offset's shifted window: [N, H, W, C] -> [N, H-k+1, W-k+1, F]."""
    k, _, c, f = kernel.shape
    n, h, w, _ = x.shape
    ho, wo = h - k + 1, w - k + 1
    per_offset = x.reshape(-1, c) @ kernel.transpose(2, 0, 1, 3).reshape(c, k * k * f)
    per_offset = per_offset.reshape(n, h, w, k, k, f)
    return functools.reduce(operator.add, (per_offset[:, i:i + ho, j:j + wo, i, j]
                                           for i in range(k) for j in range(k)))


def patches_matmul_conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """A stride-1 VALID convolution as im2col: every kernel offset's window side by side
    in the channels, then one matmul with the flattened kernel."""
    k, _, c, f = kernel.shape
    n, h, w, _ = x.shape
    ho, wo = h - k + 1, w - k + 1
    patches = jnp.concatenate([x[:, i:i + ho, j:j + wo] for i in range(k) for j in range(k)],
                              -1)
    return (patches.reshape(-1, k * k * c) @ kernel.reshape(k * k * c, f)).reshape(n, ho, wo, f)


def matmul_conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    """`lax.conv_general_dilated(x, kernel, stride, "VALID")` in NHWC/HWIO, as
    space-to-depth plus `shifted_matmul_conv`; the kernel size must be a multiple of
    the stride."""
    k = kernel.shape[0]
    if k % stride:
        raise ValueError(f"a {k}x{k} kernel is not a multiple of its stride {stride}")
    used_h = (x.shape[1] - k) // stride * stride + k  # VALID reads no row past these
    used_w = (x.shape[2] - k) // stride * stride + k
    x = space_to_depth(x[:, :used_h, :used_w], stride)
    return shifted_matmul_conv(x, kernel_to_depth(kernel, stride))


def xla_conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    return jax.lax.conv_general_dilated(x, kernel, (stride, stride), "VALID",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


class Conv(nn.Module):
    """A square VALID convolution with `flax.linen.Conv`'s parameters. Where `impl` is
    "matmul", a strided one whose kernel size is a multiple of its stride is computed
    by `matmul_conv` and a stride-1 one by `patches_matmul_conv`; otherwise, and where
    `impl` is "xla", by XLA's convolution."""

    features: int
    kernel_size: int
    stride: int
    impl: str = "xla"
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        k = self.kernel_size
        kernel = self.param("kernel", self.kernel_init, (k, k, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if self.impl == "matmul" and self.stride > 1 and k % self.stride == 0:
            return matmul_conv(x, kernel, self.stride) + bias
        if self.impl == "matmul" and self.stride == 1:
            return patches_matmul_conv(x, kernel) + bias
        return xla_conv(x, kernel, self.stride) + bias
