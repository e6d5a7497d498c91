"""What an acting function returns, in one layout for every policy: the outputs of a batch
packed into one float32 array, so that they cross from the device in one transfer, and
named again on the host as the inference stream's replies name them. A network's acting
function (policy/acting.py) and an algorithm that acts by its own search
(learners/algorithms/muzero/acting.py) both pack with `pack_outputs`; the policy runner
(policy/policy_runner.py) unpacks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from srl_jax.dataflow.env_spec import EnvSpec

Act = jax.stages.Wrapped
"""A jitted (params, obs [N, ...], state [N, S], legal actions [N, A] (width 0: all legal),
key, call counter) -> the outputs packed into one float32 array (`pack_outputs`), so a
batch's outputs cross from the device in one transfer; jitted, so that it can be compiled
ahead of time against the parameters' shapes (`PolicyRunner.compile`)."""


def pack_outputs(action: Any, logp: Any, value: Any, state: Any, xp: Any = jnp,
                 q: Any = None, search_policy: Any = None, search_depth: Any = None) -> Any:
    """[N, 2 + A + S (+ Q) (+ P + 1)] float32: log-probability, value, the action's A values
    (one for a discrete action, exact as a float below 2**24), the new recurrent state
    and, where given, every action's Q-value (`q`), then the search's policy over the
    actions and the depth of its deepest node (`search_policy`, `search_depth`, a policy
    that acts by search). `xp`: the array module (jax.numpy inside a jitted act, numpy in
    stand-ins)."""
    rows = logp.shape[0]
    columns = [logp.reshape(rows, 1), value.reshape(rows, 1), action.reshape(rows, -1), state]
    if q is not None:
        columns.append(q)
    if search_policy is not None:
        columns += [search_policy, search_depth.reshape(rows, 1)]
    return xp.concatenate([c.astype(xp.float32) for c in columns], axis=1)


def unpack_outputs(packed: np.ndarray, spec: EnvSpec) -> dict[str, np.ndarray]:
    """`pack_outputs`' arrays as the inference stream's replies name them: action, logp,
    value and, for a recurrent policy, state; `q` where the spec has `action_values`,
    `search_policy` and `search_depth` where it has `search_policy`."""
    width = spec.action_dim if spec.continuous else 1
    action = packed[:, 2:2 + width]
    outputs = {"action": action if spec.continuous else action[:, 0].astype(np.int32),
               "logp": packed[:, 0], "value": packed[:, 1]}
    at = 2 + width
    if spec.state_size:
        outputs["state"] = packed[:, at:at + spec.state_size]
    at += spec.state_size
    if spec.action_values:
        outputs["q"] = packed[:, at:at + spec.action_dim]
        at += spec.action_dim
    if spec.search_policy:
        outputs["search_policy"] = packed[:, at:at + spec.action_dim]
        outputs["search_depth"] = packed[:, at + spec.action_dim]
    return outputs
