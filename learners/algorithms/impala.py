"""IMPALA as pure functions: V-trace, the actor-critic loss, and one update over a batch.

Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures". Actors act with a policy that may be
several versions behind the learner; V-trace corrects for that lag with
truncated importance weights. A batch is one [T+1, B] block of trajectory
chunks (see srl_jax/dataflow/chunk_spec.py for the fields). The update evaluates the
*current* network on every observation, computes V-trace targets and
policy-gradient advantages from those values, and takes `minibatches` SGD
steps in one pass, splitting the batch on the env axis. How the policy reads a
minibatch (a recurrent one unrolled over each column from its stored state, the
first `burn_in` steps only warming the state; masked actions; a centralized
critic's values of the global state) comes from learners/algorithms/prepare.py.
The learner jits it over its device mesh. Rows of agents out of play (`active`
false) weigh nothing in any mean. Nothing here knows about processes or sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from learners.algorithms.impala_config import ImpalaConfig
from learners.algorithms.prepare import policy_over, prepare_actor_critic
from learners.algorithms.train_state import Batch, TrainState, descend, weighted_mean
from learners.models.distributions import Distribution
from learners.models.networks import Policy
from srl_jax.dataflow.algorithms import Sizes, with_live


class VTrace(NamedTuple):
    vs: jax.Array
    """V-trace value targets v_t, [T, B]."""
    pg_advantages: jax.Array
    """min(pg_rho_bar, rho_t) * (r_t + discount_t * v_{t+1} - V(x_t)), [T, B]."""
    rhos: jax.Array
    """Untruncated importance weights pi(a_t|x_t) / mu(a_t|x_t), [T, B]."""


def vtrace(behaviour_logp: jax.Array, target_logp: jax.Array, rewards: jax.Array,
           values: jax.Array, next_values: jax.Array, discounts: jax.Array,
           continues: jax.Array, rho_bar: float, c_bar: float, pg_rho_bar: float) -> VTrace:
    """V-trace targets and policy-gradient advantages over [T, B] arrays.

    `values[t]` is V(x_t) and `next_values[t]` the value of the state step t
    led to; `discounts[t]` is gamma, or 0 where that state is terminal; and
    `continues[t]` is 0 where the next row of the chunk does not follow step t
    (a new episode starts), 1 otherwise. With delta_t = rho_t (r_t +
    discount_t next_value_t - V(x_t)), the targets obey the paper's recursion

        v_t - V(x_t) = delta_t + discount_t c_t continues_t (v_{t+1} - V(x_{t+1}))

    from v_T = next_values[T-1] at the end of the chunk. Where continues_t is
    0 the trace is cut, and the target of the next state is `next_values[t]`
    itself: there is no data beyond it to correct it with.
    """
    log_rhos = target_logp - behaviour_logp
    rhos = jnp.exp(log_rhos)
    clipped_rhos = jnp.minimum(rho_bar, rhos)
    cs = jnp.minimum(c_bar, rhos)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    trace = discounts * cs * continues

    def backward(acc: jax.Array, step: tuple[jax.Array, jax.Array]
                 ) -> tuple[jax.Array, jax.Array]:
        delta, decay = step
        acc = delta + decay * acc
        return acc, acc

    _, corrections = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, trace),
                                  reverse=True)
    vs = values + corrections
    # The target of the state after step t: v_{t+1} inside the episode, next_values[t]
    # (unrolled no further) at the end of the chunk and where the trace was cut.
    following = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    next_vs = jnp.where(continues > 0, following, next_values)
    pg_advantages = jnp.minimum(pg_rho_bar, rhos) * (rewards + discounts * next_vs - values)
    return VTrace(vs, pg_advantages, rhos)


def episode_vtrace(behaviour_logp: jax.Array, target_logp: jax.Array, rewards: jax.Array,
                   values: jax.Array, terminated: jax.Array, truncated: jax.Array,
                   trunc_values: jax.Array, gamma: float, rho_bar: float, c_bar: float,
                   pg_rho_bar: float) -> VTrace:
    """V-trace over a chunk of [T, B] steps whose episodes may end inside it.

    `values` [T+1, B] are the learner's current estimates of obs[0..T]. Inside
    a chunk, the row after an episode's last step is the first of the next
    episode (the actor resets the env at once), so:

    - a *terminated* step has discount 0: no value after it, and since the
      trace is scaled by the discount it is also cut there;
    - a *truncated* step (time limit) bootstraps from `trunc_values`, the
      value of its final observation (the acting policy's estimate: the
      learner never sees that observation), not from values[t+1], and cuts
      the trace: v_{t+1} belongs to another episode.

    Without episode ends this is the paper's V-trace, bootstrapped from
    values[T].
    """
    next_values = jnp.where(truncated > 0, trunc_values, values[1:])
    discounts = gamma * (1.0 - terminated)
    continues = 1.0 - jnp.maximum(terminated, truncated)
    return vtrace(behaviour_logp, target_logp, rewards, values[:-1], next_values, discounts,
                  continues, rho_bar, c_bar, pg_rho_bar)


def impala_loss(params: Any, apply_fn: Callable, dist: Distribution, batch: Batch,
                config: ImpalaConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Policy gradient with V-trace advantages + value loss - entropy bonus, on [T+1, B].
    `apply_fn` answers the (T+1) * B observations, time-major, with logits already
    masked to the legal actions (`prepare.policy_over`)."""
    T, B = batch.rewards.shape
    obs = batch.obs.reshape((T + 1) * B, *batch.obs.shape[2:])
    out, values = apply_fn(params, obs)
    values = values.reshape(T + 1, B)
    out = out[:T * B]  # the policy at the bootstrap observation is not needed
    actions = batch.actions.reshape(T * B, *batch.actions.shape[2:])
    logp = dist.log_prob(out, actions).reshape(T, B)
    active = batch.active
    entropy = weighted_mean(dist.entropy(out).reshape(T, B), active)

    targets = episode_vtrace(batch.logp, jax.lax.stop_gradient(logp), batch.rewards,
                             jax.lax.stop_gradient(values), batch.terminated, batch.truncated,
                             batch.trunc_values, config.gamma, config.rho_bar, config.c_bar,
                             config.pg_rho_bar)
    pg_loss = -weighted_mean(logp * targets.pg_advantages, active)
    value_loss = 0.5 * weighted_mean(jnp.square(targets.vs - values[:-1]), active)
    loss = pg_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    info = {
        "loss": loss, "pg_loss": pg_loss, "value_loss": value_loss, "entropy": entropy,
        "rho_mean": weighted_mean(targets.rhos, active),
        "rho_clip_frac": weighted_mean(targets.rhos > config.rho_bar, active),
        # KL(behaviour || current) on the actor's samples
        "approx_kl": weighted_mean(batch.logp - logp, active),
        "advantage_mean": weighted_mean(targets.pg_advantages, active),
        "vs_mean": weighted_mean(targets.vs, active),
        "value_mean": weighted_mean(values[:-1], active),
    }
    return loss, info


def make_optimizer(impala: ImpalaConfig, sizes: Sizes) -> optax.GradientTransformation:
    """Adam's direction without its step size, which the update applies from
    `TrainState.hyper`."""
    return optax.chain(optax.clip_by_global_norm(impala.max_grad_norm),
                       optax.scale_by_adam(eps=1e-5))


def split_envs(batch: Batch, minibatches: int) -> Batch:
    """[T(+1), B, ...] -> [M, T(+1), B/M, ...]; minibatch m holds columns m, m+M, m+2M, ...

    Strided, not contiguous, so that every minibatch draws columns from every
    device when B is sharded over the learner's mesh.
    """
    def split(x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], x.shape[1] // minibatches, minibatches, *x.shape[2:])
        return jnp.moveaxis(x, 2, 0)

    return jax.tree.map(split, batch)


def make_update(policy: Policy, optimizer: optax.GradientTransformation, impala: ImpalaConfig,
                sizes: Sizes) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The IMPALA update: (state, batch) -> (state, metrics); pure, for the learner to jit.
    The `live` fields are read from `state.hyper` where it has them."""

    def update(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        live = with_live(impala, state.hyper)
        params, batch = prepare_actor_critic(state.params, batch, policy, sizes)

        def loss_of_net(net: Any, mb: Batch) -> tuple[jax.Array, dict]:
            net_params = {**params, "net": net}
            apply_fn, seqs = policy_over(policy, net_params, mb._asdict(), sizes.burn_in)
            return impala_loss(net_params, apply_fn, policy.dist, Batch(**seqs), live)

        grad_fn = jax.grad(loss_of_net, has_aux=True)

        def minibatch_step(carry: tuple, mb: Batch) -> tuple[tuple, dict[str, jax.Array]]:
            net, opt_state = carry
            grads, info = grad_fn(net, mb)
            updates, opt_state = optimizer.update(grads, opt_state, net)
            info["grad_norm"] = optax.tree.norm(grads)
            return (descend(net, updates, live.learning_rate), opt_state), info

        (net, opt_state), infos = jax.lax.scan(
            minibatch_step, (params["net"], state.opt_state),
            split_envs(batch, impala.minibatches))
        metrics = jax.tree.map(jnp.mean, infos)
        new_state = state._replace(params={**params, "net": net}, opt_state=opt_state,
                                   version=state.version + 1)
        return new_state, metrics

    return update
