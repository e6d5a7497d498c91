"""Parameters on the wire: a pytree as named numpy arrays, and back.

Leaves are named by their path in the tree; the receiver rebuilds the tree from
a template of the same structure (its own initial parameters) and refuses a
message whose names or shapes do not match.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def leaf_name(path: tuple) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def host_value(x: Any) -> np.ndarray:
    """A replicated array on the host; with several JAX processes, from a local copy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return np.asarray(x)


def params_to_arrays(params: Any) -> dict[str, np.ndarray]:
    """Named host arrays of every leaf, in tree order."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {leaf_name(path): host_value(leaf) for path, leaf in leaves}


def arrays_to_params(arrays: dict[str, np.ndarray], template: Any) -> Any:
    """Rebuild a tree shaped like `template`; ValueError if the arrays do not fit it."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    if len(arrays) != len(leaves):
        raise ValueError(f"{len(arrays)} arrays for {len(leaves)} parameters")
    out = []
    for path, leaf in leaves:
        name = leaf_name(path)
        array = arrays.get(name)
        if array is None:
            raise ValueError(f"parameter {name!r} missing")
        if array.shape != leaf.shape or array.dtype != leaf.dtype:
            raise ValueError(f"parameter {name!r}: {array.dtype}{list(array.shape)} "
                             f"where {leaf.dtype}{list(leaf.shape)} was expected")
        out.append(array)
    return jax.tree_util.tree_unflatten(treedef, out)
