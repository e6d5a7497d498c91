"""IMPALA's pure functions: V-trace against a NumPy reference, the loss, the jitted update."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learners.algorithms.impala import (
    ImpalaConfig,
    episode_vtrace,
    impala_loss,
    make_optimizer,
    make_update,
)
from learners.algorithms.ppo import gae
from learners.algorithms.sequences import episode_starts, flat_unroll
from learners.models.distributions import CATEGORICAL
from learners.training.mesh import compile_update, make_learner_mesh, put_batch, replicated
from tests.update_checks import (
    SIZES,
    B,
    T,
    check_pinned,
    check_update_trains_and_repeats,
    check_value_loss_halves,
    random_batch,
    single_agent_batch,
    sizes_for,
    small_policy_state,
)


def reference_vtrace(behaviour_logp, target_logp, rewards, values, terminated, truncated,
                     trunc_values, gamma, rho_bar, c_bar, pg_rho_bar):
    """V-trace by the paper's definition (eq. 1), one column and one step at a time.

        v_s = V(x_s) + sum_{t=s}^{e} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t,
        delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),

    where e is the last step of s's episode inside the chunk (its end, or T-1),
    gamma_t is 0 at a terminal step and V(x_{t+1}) is the final observation's
    value at a truncated one. The advantage is
    min(pg_rho_bar, rho_s) (r_s + gamma_s v_{s+1} - V(x_s)), with v_{s+1} the
    final observation's value at a truncation and values[T] at the chunk's end.
    """
    T, B = rewards.shape
    f64 = [np.asarray(x, np.float64) for x in (behaviour_logp, target_logp, rewards, values,
                                                trunc_values)]
    behaviour_logp, target_logp, rewards, values, trunc_values = f64
    ratios = np.exp(target_logp - behaviour_logp)
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    def next_value(t, b):
        if terminated[t, b]:
            return 0.0
        if truncated[t, b]:
            return trunc_values[t, b]
        return values[t + 1, b]

    def delta(t, b):
        rho = min(rho_bar, ratios[t, b])
        return rho * (rewards[t, b] + gamma * next_value(t, b) - values[t, b])

    for b in range(B):
        for s in range(T):
            total, weight, t = 0.0, 1.0, s
            while True:
                total += weight * delta(t, b)
                if terminated[t, b] or truncated[t, b] or t == T - 1:
                    break
                weight *= gamma * min(c_bar, ratios[t, b])
                t += 1
            vs[s, b] = values[s, b] + total
        for s in range(T):
            if terminated[s, b]:
                following = 0.0
            elif truncated[s, b]:
                following = trunc_values[s, b]
            elif s == T - 1:
                following = values[T, b]
            else:
                following = vs[s + 1, b]
            adv[s, b] = min(pg_rho_bar, ratios[s, b]) * (
                rewards[s, b] + gamma * following - values[s, b])
    return vs, adv


def discounted_returns(rewards, values, terminated, truncated, trunc_values, gamma):
    """The n-step return to the episode's end in the chunk, bootstrapped where it was cut."""
    T, B = rewards.shape
    returns = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                total += weight * float(rewards[t, b])
                weight *= gamma
                if terminated[t, b]:
                    break
                if truncated[t, b]:
                    total += weight * float(trunc_values[t, b])
                    break
                if t == T - 1:
                    total += weight * float(values[T, b])
            returns[s, b] = total
    return returns


def random_chunk(seed: int, T: int = 12, B: int = 5, end_prob: float = 0.15):
    rng = np.random.default_rng(seed)
    terminated = rng.random((T, B)) < end_prob
    truncated = (rng.random((T, B)) < end_prob) & ~terminated
    # Make sure each kind of end, and one at the chunk's last step, is in every chunk.
    terminated[T // 3, 0], truncated[T // 3, 0] = True, False
    truncated[T // 2, 1], terminated[T // 2, 1] = True, False
    truncated[T - 1, 2], terminated[T - 1, 2] = True, False
    terminated[T - 1, 3], truncated[T - 1, 3] = True, False
    behaviour_logp = -rng.exponential(1.0, (T, B))
    return {
        "behaviour_logp": behaviour_logp.astype(np.float32),
        "target_logp": (behaviour_logp + rng.normal(0.0, 0.7, (T, B))).astype(np.float32),
        "rewards": rng.normal(size=(T, B)).astype(np.float32),
        "values": rng.normal(size=(T + 1, B)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "trunc_values": rng.normal(size=(T, B)).astype(np.float32),
    }


def run_vtrace(chunk: dict, gamma: float, rho_bar: float, c_bar: float, pg_rho_bar: float):
    out = jax.jit(episode_vtrace)(
        chunk["behaviour_logp"], chunk["target_logp"], chunk["rewards"], chunk["values"],
        chunk["terminated"].astype(np.float32), chunk["truncated"].astype(np.float32),
        chunk["trunc_values"], gamma, rho_bar, c_bar, pg_rho_bar)
    return np.asarray(out.vs), np.asarray(out.pg_advantages), np.asarray(out.rhos)


@pytest.mark.parametrize("seed", range(6))
def test_vtrace_matches_the_reference_with_episode_ends(seed):
    chunk = random_chunk(seed)
    rng = np.random.default_rng(100 + seed)
    gamma = float(rng.uniform(0.8, 1.0))
    rho_bar, c_bar, pg_rho_bar = (float(x) for x in rng.uniform(0.3, 2.0, 3))
    vs, adv, rhos = run_vtrace(chunk, gamma, rho_bar, c_bar, pg_rho_bar)
    ref_vs, ref_adv = reference_vtrace(**chunk, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar,
                                       pg_rho_bar=pg_rho_bar)
    assert vs.shape == adv.shape == chunk["rewards"].shape
    # The thresholds bite: some weights are clipped, some not.
    assert (rhos > min(rho_bar, c_bar)).any() and (rhos < max(rho_bar, c_bar)).any()
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def test_vtrace_without_episode_ends_matches_the_reference():
    chunk = random_chunk(7, T=20, end_prob=0.0)
    chunk["terminated"][:] = False
    chunk["truncated"][:] = False
    vs, adv, _ = run_vtrace(chunk, 0.97, 1.0, 0.9, 1.2)
    ref_vs, ref_adv = reference_vtrace(**chunk, gamma=0.97, rho_bar=1.0, c_bar=0.9,
                                       pg_rho_bar=1.2)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def test_trunc_values_are_read_only_at_truncated_steps():
    chunk = random_chunk(3)
    vs, adv, _ = run_vtrace(chunk, 0.9, 1.0, 1.0, 1.0)
    chunk["trunc_values"] = np.where(chunk["truncated"], chunk["trunc_values"], 1e6)
    vs2, adv2, _ = run_vtrace(chunk, 0.9, 1.0, 1.0, 1.0)
    np.testing.assert_array_equal(vs, vs2)
    np.testing.assert_array_equal(adv, adv2)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("clip", [1.0, 1e9])
def test_on_policy_vtrace_is_the_bootstrapped_discounted_return(seed, clip):
    chunk = random_chunk(seed)
    chunk["target_logp"] = chunk["behaviour_logp"]
    gamma = 0.95
    vs, adv, rhos = run_vtrace(chunk, gamma, clip, clip, clip)
    np.testing.assert_allclose(rhos, 1.0)
    returns = discounted_returns(chunk["rewards"], chunk["values"], chunk["terminated"],
                                 chunk["truncated"], chunk["trunc_values"], gamma)
    np.testing.assert_allclose(vs, returns, rtol=1e-5, atol=1e-5)
    # ... which is also what GAE with lambda = 1 returns.
    _, gae_returns = gae(chunk["rewards"], chunk["values"],
                         chunk["terminated"].astype(np.float32),
                         chunk["truncated"].astype(np.float32), chunk["trunc_values"], gamma, 1.0)
    np.testing.assert_allclose(vs, np.asarray(gae_returns), rtol=1e-5, atol=1e-5)
    # On-policy, the advantage is the one-step TD error against the next target.
    ends = chunk["terminated"] | chunk["truncated"]
    inner = ~ends[:-1]
    expected = chunk["rewards"][:-1] + gamma * vs[1:] - chunk["values"][:-2]
    np.testing.assert_allclose(adv[:-1][inner], expected[inner], rtol=1e-5, atol=1e-5)


def test_vtrace_hand_computed():
    # One env, T = 3, gamma = 0.5; step 1 is truncated (final obs worth 8).
    # Ratios 2, 0.5, 1 with rho_bar = c_bar = pg_rho_bar = 1: clipped rhos 1, 0.5, 1.
    behaviour = np.log(np.array([[0.25], [0.5], [0.5]], np.float32))
    target = np.log(np.array([[0.5], [0.25], [0.5]], np.float32))
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    values = np.array([[1.0], [2.0], [4.0], [6.0]], np.float32)
    terminated = np.zeros((3, 1), np.float32)
    truncated = np.array([[0.0], [1.0], [0.0]], np.float32)
    trunc_values = np.array([[0.0], [8.0], [0.0]], np.float32)
    # delta_2 = 1 * (3 + 0.5 * 6 - 4) = 2                 v_2 = 4 + 2 = 6
    # delta_1 = 0.5 * (2 + 0.5 * 8 - 2) = 2 (trace cut)   v_1 = 2 + 2 = 4
    # delta_0 = 1 * (1 + 0.5 * 2 - 1) = 1
    #   v_0 = 1 + 1 + 0.5 * c_0 (= 1) * (v_1 - V_1 = 2) = 3
    # adv_2 = 1 * (3 + 0.5 * 6 - 4) = 2; adv_1 = 0.5 * (2 + 0.5 * 8 - 2) = 2;
    # adv_0 = 1 * (1 + 0.5 * v_1 - 1) = 2
    out = episode_vtrace(behaviour, target, rewards, values, terminated, truncated, trunc_values,
                         0.5, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(np.asarray(out.vs)[:, 0], [3.0, 4.0, 6.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.pg_advantages)[:, 0], [2.0, 2.0, 2.0], rtol=1e-6)


def stub_apply(params, obs):
    """The 'network' returns the given logits and values: the test is about the loss math."""
    return params["logits"], params["values"]


def test_impala_loss_gradients():
    T, B, A = 4, 3, 2
    rng = np.random.default_rng(0)
    batch = single_agent_batch(
        obs=np.zeros((T + 1, B, 1), np.float32),
        actions=rng.integers(0, A, (T, B)).astype(np.int32),
        logp=np.log(rng.uniform(0.2, 0.8, (T, B))).astype(np.float32),
        values=np.zeros((T + 1, B), np.float32),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        terminated=np.zeros((T, B), np.float32),
        truncated=np.zeros((T, B), np.float32),
        trunc_values=np.zeros((T, B), np.float32),
        state=np.zeros((1, B, 0), np.float32),
    )
    params = {"logits": jnp.asarray(rng.normal(size=((T + 1) * B, A)), jnp.float32),
              "values": jnp.asarray(rng.normal(size=(T + 1) * B), jnp.float32)}
    config = ImpalaConfig(gamma=0.9, vf_coef=0.5, ent_coef=0.0)
    grads, info = jax.jit(jax.grad(
        lambda p: impala_loss(p, stub_apply, CATEGORICAL, batch, config), has_aux=True))(params)
    values = np.asarray(params["values"]).reshape(T + 1, B)
    logp = np.asarray(CATEGORICAL.log_prob(params["logits"][:T * B],
                                           batch.actions.reshape(-1))).reshape(T, B)
    vs, adv = reference_vtrace(batch.logp, logp, batch.rewards, values, batch.terminated,
                               batch.truncated, batch.trunc_values, 0.9, 1.0, 1.0, 1.0)
    # Value: d(0.5 * 0.5 * mean((vs - V)^2))/dV = 0.5 * (V - vs) / (T B); targets are constants,
    # so the bootstrap row gets no gradient.
    grad_v = np.asarray(grads["values"]).reshape(T + 1, B)
    np.testing.assert_allclose(grad_v[:T], 0.5 * (values[:T] - vs) / (T * B), atol=1e-6)
    np.testing.assert_allclose(grad_v[T], 0.0)
    # Policy: d(-mean(adv * logp))/dlogits = -adv (onehot(a) - p) / (T B), advantages constant.
    probs = np.asarray(jax.nn.softmax(params["logits"][:T * B]))
    onehot = np.eye(A)[batch.actions.reshape(-1)]
    expected = -adv.reshape(-1, 1) * (onehot - probs) / (T * B)
    grad_logits = np.asarray(grads["logits"])
    np.testing.assert_allclose(grad_logits[:T * B], expected, atol=1e-6)
    np.testing.assert_allclose(grad_logits[T * B:], 0.0)
    assert float(info["pg_loss"]) == pytest.approx(-(adv * logp).mean(), rel=1e-5)
    assert float(info["value_loss"]) == pytest.approx(0.5 * ((vs - values[:T]) ** 2).mean(),
                                                      rel=1e-5)
    assert float(info["rho_mean"]) == pytest.approx(np.exp(logp - batch.logp).mean(), rel=1e-5)


IMPALA = ImpalaConfig(learning_rate=1e-3, minibatches=2)


def fresh_state(config: ImpalaConfig = IMPALA, core: str = "none"):
    optimizer = make_optimizer(config, sizes_for(core))
    policy, state = small_policy_state(optimizer, core)
    return policy, optimizer, state


METRICS = ("loss", "pg_loss", "value_loss", "entropy", "rho_mean", "rho_clip_frac", "approx_kl",
           "advantage_mean", "vs_mean", "value_mean", "grad_norm")


@pytest.mark.parametrize(("core", "burn_in"), [("none", 0), ("lstm", 0), ("gru", 3)])
def test_make_update_trains_a_real_network_deterministically(core, burn_in):
    """Feed-forward, and recurrent unrolled over whole columns (with burn-in)."""
    policy, optimizer, _ = fresh_state(core=core)
    update = jax.jit(make_update(policy, optimizer, IMPALA, sizes_for(core, burn_in)),
                     donate_argnums=0)
    check_update_trains_and_repeats(update, lambda: fresh_state(core=core),
                                    random_batch(state_size=policy.state_size), METRICS)


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_one_minibatch_update_is_the_loss_gradient_step(core):
    # With one minibatch the metrics are the loss on the whole batch at the old params: for
    # a recurrent policy, unrolled from the stored state with resets after episode ends.
    config = dataclasses.replace(IMPALA, minibatches=1)
    policy, optimizer, state = fresh_state(config, core)
    batch = random_batch(2, policy.state_size)
    apply_fn = flat_unroll(policy, batch.state[0],
                           episode_starts(batch.terminated, batch.truncated, T + 1))
    _, info = impala_loss(state.params, apply_fn, policy.dist, batch, config)
    _, metrics = jax.jit(make_update(policy, optimizer, config, sizes_for(core)))(state, batch)
    for key in ("loss", "pg_loss", "value_loss", "entropy", "rho_mean"):
        assert float(metrics[key]) == pytest.approx(float(info[key]), rel=1e-5, abs=1e-6), key


PINNED = {  # what the update computed before its sample preparation moved to prepare.py
    ("none", 0): {"loss": 2.9718881, "pg_loss": 1.3621204, "value_loss": 3.2333980,
                  "entropy": 0.69313514, "moved": 1.3648862e-3},
    ("lstm", 2): {"loss": 2.0541878, "pg_loss": 1.1073325, "value_loss": 1.9075735,
                  "entropy": 0.69314629, "moved": -0.025574019},
}


@pytest.mark.parametrize(("core", "burn_in"), sorted(PINNED))
def test_the_update_computes_the_numbers_it_always_has(core, burn_in):
    policy, optimizer, state = fresh_state(core=core)
    update = jax.jit(make_update(policy, optimizer, IMPALA, sizes_for(core, burn_in)))
    check_pinned(update, state, random_batch(state_size=policy.state_size),
                 PINNED[core, burn_in])


def test_make_update_reduces_the_value_loss_on_a_fixed_batch():
    # A short horizon, so that the bootstrapped targets do not run away from the values.
    config = dataclasses.replace(IMPALA, learning_rate=3e-3, minibatches=1, gamma=0.5)
    policy, optimizer, state = fresh_state(config)
    update = jax.jit(make_update(policy, optimizer, config, SIZES), donate_argnums=0)
    check_value_loss_halves(update, state, random_batch(1), steps=30)


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_update_compiles_for_the_learner_mesh(core):
    policy, optimizer, state = fresh_state(core=core)
    mesh = make_learner_mesh(0, B)
    state = jax.device_put(state, replicated(mesh))
    batch = put_batch(random_batch(state_size=policy.state_size), mesh)
    update = compile_update(make_update(policy, optimizer, IMPALA, sizes_for(core)), mesh,
                            state, batch)
    state, metrics = update(state, batch)
    assert int(state.version) == 1
    assert np.isfinite(float(metrics["loss"]))
