"""Acting and reanalysing by search: Gumbel MuZero (Danihelka et al. 2022) from mctx,
batched over a request's rows and jitted where it is called.

The model reaches the search as two functions of scalars (`ModelFns`), so a test can hand
it a known model; `model_fns` builds them from a `MuZeroModel` and its supports. A search
returns the action to take, the improved policy that trains the policy head (softmax of
prior logits plus completed Q-values), the root's search value that the value targets
bootstrap from, and the deepest node it expanded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import mctx

from learners.models.muzero_model import MuZeroModel, logit_fns
from learners.models.support import from_support


class ModelFns(NamedTuple):
    """A model as the search calls it, values and rewards as scalars."""

    initial: Callable[[Any, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]
    """(params, obs [N, ...]) -> (latent, prior logits [N, A], value [N])."""
    recurrent: Callable[[Any, jax.Array, jax.Array],
                        tuple[jax.Array, jax.Array, jax.Array, jax.Array]]
    """(params, latent, action [N]) -> (latent, reward [N], prior logits, value [N])."""


class SearchOutput(NamedTuple):
    action: jax.Array
    """[N] int32: the action to take."""
    policy: jax.Array
    """[N, A]: the search's improved policy, the policy head's target."""
    root_value: jax.Array
    """[N]: the root's value after the search, which value targets bootstrap from."""
    depth: jax.Array
    """[N] int32: the depth of the deepest node the search expanded."""


def model_fns(model: MuZeroModel) -> ModelFns:
    """The search's view of `model`: its support logits turned into scalars."""
    size, epsilon, logits = model.support_size, model.rescaling_epsilon, logit_fns(model)

    def initial(params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        latent, policy, value = logits.initial(params, obs)
        return latent, policy, from_support(value, size, epsilon)

    def recurrent(params: Any, latent: jax.Array, action: jax.Array) -> tuple:
        latent, reward, policy, value = logits.recurrent(params, latent, action)
        return (latent, from_support(reward, size, epsilon), policy,
                from_support(value, size, epsilon))

    return ModelFns(initial, recurrent)


def tree_depth(tree: mctx.Tree) -> jax.Array:
    """[B] the depth of the deepest expanded node (the root is 0). Nodes are added in
    order, so a parent's depth is known before its children's."""
    nodes = tree.parents.shape[1]

    def visit(depth: jax.Array, node: jax.Array) -> tuple[jax.Array, None]:
        parent = jnp.maximum(tree.parents[:, node], 0)
        parent_depth = jnp.take_along_axis(depth, parent[:, None], 1)[:, 0]
        expanded = tree.node_visits[:, node] > 0
        return depth.at[:, node].set(jnp.where(expanded, parent_depth + 1, 0)), None

    start = jnp.zeros(tree.parents.shape, jnp.int32)
    depth, _ = jax.lax.scan(visit, start, jnp.arange(1, nodes))
    return depth.max(1)


def tree_scaled_qtransform(tree: mctx.Tree, node_index: jax.Array, *,
                           value_scale: float = 0.1, maxvisit_init: float = 50.0,
                           epsilon: float = 1e-8) -> jax.Array:
    """Gumbel MuZero's completed Q-values (mctx's `qtransform_completed_by_mix_value`),
    scaled to [0, 1] by the range of every value the search tree holds, as MuZero's
    min-max statistics do, not by the range of the node's own children: with two actions
    the children's range turns any difference in Q into a gap of 0 or 1, so that the
    improved policy, the policy head's target, is one-hot whatever the model thinks."""
    scaled = mctx.qtransform_completed_by_mix_value(
        tree, node_index, value_scale=value_scale, maxvisit_init=maxvisit_init,
        rescale_values=False)
    scale = (maxvisit_init + jnp.max(tree.children_visits[node_index])) * value_scale
    completed = scaled / scale
    visited = tree.node_visits > 0
    low = jnp.minimum(jnp.min(jnp.where(visited, tree.node_values, jnp.inf)), completed.min())
    high = jnp.maximum(jnp.max(jnp.where(visited, tree.node_values, -jnp.inf)),
                       completed.max())
    return scale * (completed - low) / jnp.maximum(high - low, epsilon)


def search(fns: ModelFns, params: Any, obs: jax.Array, key: jax.Array, simulations: int,
           gamma: float, considered_actions: int = 16, gumbel_scale: float = 1.0,
           legal: jax.Array | None = None) -> SearchOutput:
    """Gumbel MuZero's search from each row of `obs` [N, ...], `simulations` each, among
    the `legal` actions [N, A] at the root (None: all). `gumbel_scale` 0 searches without
    sampling (evaluation)."""
    latent, logits, value = fns.initial(params, obs)
    root = mctx.RootFnOutput(prior_logits=logits, value=value, embedding=latent)

    def recurrent_fn(params: Any, _: jax.Array, action: jax.Array,
                     latent: jax.Array) -> tuple[mctx.RecurrentFnOutput, jax.Array]:
        latent, reward, logits, value = fns.recurrent(params, latent, action)
        discount = jnp.full_like(value, gamma)
        return mctx.RecurrentFnOutput(reward=reward, discount=discount, prior_logits=logits,
                                      value=value), latent

    out = mctx.gumbel_muzero_policy(
        params, key, root, recurrent_fn, simulations,
        invalid_actions=None if legal is None else ~legal,
        max_num_considered_actions=min(considered_actions, logits.shape[-1]),
        gumbel_scale=gumbel_scale, qtransform=tree_scaled_qtransform)
    return SearchOutput(out.action.astype(jnp.int32), out.action_weights,
                        out.search_tree.summary().value, tree_depth(out.search_tree))
