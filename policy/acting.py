"""Acting with the experiment's policy: the jitted acting function and its runner.

Used by the inference server, by actors in inline-inference mode and by the
evaluator; the batching itself is `policy.policy_runner.PolicyRunner`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from learners.models.distributions import mask_logits
from learners.models.networks import Policy, init_policy_params, make_policy
from learners.models.outputs import Act, pack_outputs
from policy.policy_runner import PolicyRunner, padded_sizes
from srl_jax.config.schema import ExperimentConfig
from srl_jax.dataflow.algorithms import algorithm_config, network_of
from srl_jax.dataflow.env_spec import EnvSpec


def make_act(policy: Policy, action_values: bool = False) -> Act:
    """(params, obs [N, ...], state [N, S], legal actions [N, A or 0], key, counter) ->
    action, log-probability, value, new state and, with `action_values` (a Q policy),
    every action's Q-value, packed into one array (`pack_outputs`)."""

    def act(params: Any, obs: jax.Array, state: jax.Array, mask: jax.Array, key: jax.Array,
            counter: jax.Array) -> tuple:
        out, value, new_state = policy.apply(params, obs, state)
        out = mask_logits(out, mask)
        action = policy.dist.sample(jax.random.fold_in(key, counter), out)
        return pack_outputs(action, policy.dist.log_prob(out, action), value, new_state,
                            q=out if action_values else None)

    return jax.jit(act)


def make_runner(config: ExperimentConfig, spec: EnvSpec, sampling_seed: int, min_size: int,
                max_size: int, published: bool = False, explore: bool = True) -> PolicyRunner:
    """A runner of the configured network with version 0 of its parameters (from the
    seed, as the learner builds them), padded from `min_size` to `max_size` rows;
    not compiled yet (`PolicyRunner.compile`). Where a learner `published` the
    parameters, the runner holds only their shapes until it takes the first: nothing
    is initialised (a server would spend a good part of its start-up on it). An
    network that acts by search (`Network.search_act`) acts with its search, which
    samples at the root where `explore` (not for reanalysis, whose targets are the
    model's, not a draw's)."""
    policy, network = make_policy(config, spec)
    init = functools.partial(init_policy_params, network, spec.obs_shape, config.seed)
    params = jax.eval_shape(init) if published else init()
    search_act = network_of(config).search_act
    act = make_act(policy, spec.action_values) if search_act is None else \
        search_act(network, algorithm_config(config), 1.0 if explore else 0.0)
    return PolicyRunner(act, params, spec, padded_sizes(min_size, max_size), sampling_seed)
