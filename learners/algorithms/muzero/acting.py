"""Acting by search: the inference server's jitted call for a MuZero policy, in the
policy runner's calling convention (`learners.models.outputs.Act`), so a request's
rows are searched in one batch on the server's device and their outputs cross back in one
transfer. The packed outputs hold the action, the log-probability of the action under
the search's policy, the root's value, the (empty) recurrent state, the search's policy,
which the actors store for training (`EnvSpec.search_policy`), and the depth of the
deepest node the search expanded, which the server counts."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from learners.algorithms.muzero.search import model_fns, search
from learners.algorithms.muzero_config import MuZeroConfig
from learners.models.muzero_model import MuZeroModel
from learners.models.outputs import Act, pack_outputs


def make_search_act(model: MuZeroModel, config: MuZeroConfig, gumbel_scale: float = 1.0,
                    ) -> Act:
    """(params, obs, state, legal actions [N, A or 0], key, counter) -> packed outputs;
    `gumbel_scale` 0 for evaluation (no sampling at the root)."""
    fns = model_fns(model)

    def act(params: Any, obs: jax.Array, state: jax.Array, mask: jax.Array, key: jax.Array,
            counter: jax.Array) -> jax.Array:
        legal = mask if mask.shape[-1] else None
        out = search(fns, params["net"], obs, jax.random.fold_in(key, counter),
                     config.simulations, config.gamma, config.considered_actions,
                     gumbel_scale, legal)
        taken = jnp.take_along_axis(out.policy, out.action[:, None], -1)[:, 0]
        return pack_outputs(out.action, jnp.log(jnp.maximum(taken, 1e-30)), out.root_value,
                            state, search_policy=out.policy, search_depth=out.depth)

    return jax.jit(act)
