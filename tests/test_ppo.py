"""PPO's pure functions: GAE and the clipped loss by hand, the jitted update on a real network."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learners.algorithms.ppo import (
    PPOConfig,
    gae,
    init_extra,
    make_optimizer,
    make_update,
    ppo_loss,
)
from learners.algorithms.value_norm import (
    denormalize,
    init_value_norm,
    moments,
    normalize,
    update_value_norm,
)
from learners.models.distributions import CATEGORICAL
from srl_jax.dataflow.algorithms import Sizes
from tests.update_checks import (
    SIZES,
    check_pinned,
    check_update_trains_and_repeats,
    check_value_loss_halves,
    random_batch,
    sizes_for,
    small_policy_state,
)


def test_gae_hand_computed_with_termination_and_truncation():
    # gamma = 0.9, lambda = 0.8, so gamma * lambda = 0.72. Columns are two envs.
    rewards = np.array([[1.0, 1.0], [2.0, 1.0], [1.0, 1.0]], np.float32)
    values = np.array([[0.5, 1.0], [1.0, 2.0], [2.0, 3.0], [4.0, 5.0]], np.float32)
    # env 0 terminates at t=1; env 1 is truncated at t=0 (its final obs is worth 10).
    terminated = np.array([[False, False], [True, False], [False, False]])
    truncated = np.array([[False, True], [False, False], [False, False]])
    # Only truncated steps read trunc_values: the 99s must be ignored.
    trunc_values = np.array([[99.0, 10.0], [99.0, 99.0], [99.0, 99.0]], np.float32)

    # env 0:
    #   t=2: delta = 1 + 0.9 * 4.0 - 2.0 = 2.6                 adv = 2.6
    #   t=1: terminal, no bootstrap: delta = 2 - 1.0 = 1.0     adv = 1.0 (recursion cut)
    #   t=0: delta = 1 + 0.9 * 1.0 - 0.5 = 1.4                 adv = 1.4 + 0.72 * 1.0 = 2.12
    # env 1:
    #   t=2: delta = 1 + 0.9 * 5.0 - 3.0 = 2.5                 adv = 2.5
    #   t=1: delta = 1 + 0.9 * 3.0 - 2.0 = 1.7                 adv = 1.7 + 0.72 * 2.5 = 3.5
    #   t=0: truncated, bootstraps from trunc_values, not values[1]:
    #        delta = 1 + 0.9 * 10.0 - 1.0 = 9.0                adv = 9.0 (recursion cut)
    expected_adv = np.array([[2.12, 9.0], [1.0, 3.5], [2.6, 2.5]])
    # returns = advantages + values[:-1]
    expected_ret = np.array([[2.62, 10.0], [2.0, 5.5], [4.6, 5.5]])

    advantages, returns = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(terminated),
                              jnp.asarray(truncated), jnp.asarray(trunc_values), 0.9, 0.8)
    assert advantages.shape == returns.shape == (3, 2)
    np.testing.assert_allclose(np.asarray(advantages), expected_adv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(returns), expected_ret, rtol=1e-6, atol=1e-6)


def test_gae_lambda_one_is_discounted_return_minus_value():
    # No episode end, lambda = 1: advantage = sum_k gamma^k r_{t+k} + gamma^(T-t) V_T - V_t.
    rewards = np.array([[1.0], [0.0], [2.0]], np.float32)
    values = np.array([[0.0], [1.0], [0.0], [3.0]], np.float32)
    flags = np.zeros((3, 1), bool)
    # t=2: 2 + 0.5 * 3 - 0 = 3.5;  t=1: 0 + 0.5 * 2 + 0.25 * 3 - 1 = 0.75;
    # t=0: 1 + 0 + 0.25 * 2 + 0.125 * 3 - 0 = 1.875
    advantages, returns = gae(rewards, values, flags, flags, np.zeros((3, 1), np.float32),
                              0.5, 1.0)
    np.testing.assert_allclose(np.asarray(advantages)[:, 0], [1.875, 0.75, 3.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(returns)[:, 0], [1.875, 1.75, 3.5], rtol=1e-6)


# A tiny batch of three samples over two actions, all taking action 0.
LN3 = np.log(3.0)
LOGITS = np.array([[0.0, 0.0], [LN3, 0.0], [0.0, LN3]], np.float32)  # p(0) = 0.5, 0.75, 0.25
VALUES = np.array([0.5, 1.0, 2.0], np.float32)
ACTIONS = np.array([0, 0, 0], np.int32)
OLD_LOGP = np.log(np.array([0.5, 0.5, 0.5], np.float32))  # ratios 1.0, 1.5, 0.5
ADVANTAGES = np.array([1.0, 2.0, -1.0], np.float32)
RETURNS = np.array([1.0, 1.0, 0.0], np.float32)
ALL_ACTIVE = np.ones(3, np.float32)
OBS = np.zeros((3, 4), np.float32)


def stub_apply(params, obs):
    """The 'network' returns the given logits and values: the test is about the loss math."""
    return params["logits"], params["values"]


def run_loss(config: PPOConfig, params=None):
    params = params or {"logits": jnp.asarray(LOGITS), "values": jnp.asarray(VALUES)}
    return ppo_loss(params, stub_apply, CATEGORICAL, OBS, ACTIONS, OLD_LOGP, VALUES, ADVANTAGES,
                    RETURNS, ALL_ACTIVE, config)


def check(info: dict, key: str, expected: float) -> None:
    np.testing.assert_allclose(float(info[key]), expected, rtol=1e-5, atol=1e-6, err_msg=key)


def test_ppo_loss_hand_computed_without_normalization():
    config = PPOConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, normalize_advantages=False)
    loss, info = run_loss(config)
    # Per sample max(-A * r, -A * clip(r, 0.8, 1.2)):
    #   s0: A=1,  r=1.0:                          -1.0
    #   s1: A=2,  r=1.5: max(-3.0, -2.4)        = -2.4   (clipped)
    #   s2: A=-1, r=0.5: max(0.5, 0.8)          =  0.8   (clipped)
    pg_loss = (-1.0 - 2.4 + 0.8) / 3
    # 0.5 * mean((V - R)^2) = 0.5 * (0.25 + 0 + 4) / 3
    value_loss = 0.5 * 4.25 / 3
    # entropy: ln 2 for (0.5, 0.5); -(0.75 ln 0.75 + 0.25 ln 0.25) twice
    h = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    entropy = (np.log(2.0) + 2 * h) / 3
    check(info, "pg_loss", pg_loss)  # -0.8667
    check(info, "value_loss", value_loss)  # 0.7083
    check(info, "entropy", entropy)  # 0.6059
    check(info, "loss", pg_loss + 0.5 * value_loss - 0.01 * entropy)
    assert float(loss) == pytest.approx(float(info["loss"]))
    check(info, "clip_frac", 2 / 3)  # |r - 1| > 0.2 for s1 and s2
    # mean((r - 1) - ln r) = (0 + (0.5 - ln 1.5) + (-0.5 + ln 2)) / 3
    check(info, "approx_kl", (0.5 - np.log(1.5) - 0.5 + np.log(2.0)) / 3)


def test_ppo_loss_hand_computed_with_normalization():
    config = PPOConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, normalize_advantages=True)
    loss, info = run_loss(config)
    # A = (1, 2, -1): mean 2/3, deviations (1/3, 4/3, -5/3), population variance
    # (1 + 16 + 25) / 27 = 14/9, std = sqrt(14)/3, so A_hat = (1, 4, -5) / sqrt(14).
    s = np.sqrt(14.0)
    #   s0: r=1:                     -1/s
    #   s1: A>0, r=1.5 clipped:      -1.2 * 4/s
    #   s2: A<0, r=0.5 clipped:       0.8 * 5/s
    pg_loss = (-1.0 - 4.8 + 4.0) / s / 3  # = -0.6 / sqrt(14) = -0.1604
    check(info, "pg_loss", pg_loss)
    check(info, "value_loss", 0.5 * 4.25 / 3)  # normalization does not touch the value loss
    check(info, "clip_frac", 2 / 3)
    h = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    check(info, "loss", pg_loss + 0.5 * 0.5 * 4.25 / 3 - 0.01 * (np.log(2.0) + 2 * h) / 3)
    assert float(loss) == pytest.approx(float(info["loss"]))


def test_ppo_loss_gradient_stops_at_the_clip():
    config = PPOConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.0, normalize_advantages=False)
    params = {"logits": jnp.asarray(LOGITS), "values": jnp.asarray(VALUES)}
    grads, _ = jax.jit(jax.grad(lambda p: run_loss(config, p), has_aux=True))(params)
    # Samples 1 and 2 are clipped in the pessimistic direction: no policy gradient.
    # Sample 0: d(-A r / 3)/d logits = -(1/3) * r * (onehot(0) - p) = -(1/3) * (0.5, -0.5).
    np.testing.assert_allclose(np.asarray(grads["logits"]),
                               [[-1 / 6, 1 / 6], [0.0, 0.0], [0.0, 0.0]], atol=1e-6)
    # V - R = (-0.5, 0, 2); d(0.5 * 0.5 * mean((V - R)^2))/dV = 0.5 * (V - R) / 3
    np.testing.assert_allclose(np.asarray(grads["values"]), [-0.5 / 6, 0.0, 2.0 / 6], atol=1e-6)


PPO = PPOConfig(learning_rate=1e-3, epochs=2, minibatches=4)


def fresh_state(config: PPOConfig = PPO, core: str = "none"):
    optimizer = make_optimizer(config, sizes_for(core))
    policy, state = small_policy_state(optimizer, core)
    return policy, optimizer, state


@pytest.mark.parametrize(("core", "burn_in"), [("none", 0), ("lstm", 0), ("gru", 3)])
def test_make_update_trains_a_real_network_deterministically(core, burn_in):
    """Feed-forward minibatches of steps, recurrent ones of whole columns (with burn-in)."""
    policy, optimizer, _ = fresh_state(core=core)
    update = jax.jit(make_update(policy, optimizer, PPO, sizes_for(core, burn_in)),
                     donate_argnums=0)
    batch = random_batch(state_size=policy.state_size)
    metrics = check_update_trains_and_repeats(
        update, lambda: fresh_state(core=core), batch,
        ("loss", "pg_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "advantage_mean",
         "return_mean"))
    # The advantages reported are those of GAE over the batch with the config's gamma/lambda.
    advantages, returns = gae(batch.rewards, batch.values, batch.terminated, batch.truncated,
                              batch.trunc_values, PPO.gamma, PPO.gae_lambda)
    assert metrics["advantage_mean"] == pytest.approx(float(advantages.mean()), rel=1e-5)
    assert metrics["return_mean"] == pytest.approx(float(returns.mean()), rel=1e-5)


PINNED = {  # what the update computed before its sample preparation moved to prepare.py
    ("none", 0): {"loss": 2.1555793, "pg_loss": -3.0877953e-4, "value_loss": 4.3256388,
                  "entropy": 0.69312572, "moved": -0.056779729},
    ("lstm", 2): {"loss": 1.7132289, "pg_loss": -1.6101245e-3, "value_loss": 3.4435408,
                  "entropy": 0.69313943, "moved": -0.10128465},
}


@pytest.mark.parametrize(("core", "burn_in"), sorted(PINNED))
def test_the_update_computes_the_numbers_it_always_has(core, burn_in):
    policy, optimizer, state = fresh_state(core=core)
    update = jax.jit(make_update(policy, optimizer, PPO, sizes_for(core, burn_in)))
    check_pinned(update, state, random_batch(state_size=policy.state_size),
                 PINNED[core, burn_in])


def test_make_update_reduces_the_value_loss_on_a_fixed_batch():
    config = dataclasses.replace(PPO, learning_rate=3e-3, clip_value_loss=False)
    policy, optimizer, state = fresh_state(config)
    update = jax.jit(make_update(policy, optimizer, config, SIZES), donate_argnums=0)
    check_value_loss_halves(update, state, random_batch(1), steps=15)


def test_value_clipping_takes_the_larger_error():
    # Values 0.5, 1.0, 2.0 against old values 0, 1, 3 and returns 1, 1, 0, clip 0.2:
    #   unclipped errors (v - R)^2: 0.25, 0, 4
    #   clipped values old + clip(v - old, +-0.2): 0.2, 1.0, 2.8 -> errors 0.64, 0, 7.84
    #   max: 0.64, 0, 7.84 -> value_loss = 0.5 * mean = 0.5 * 8.48 / 3
    config = PPOConfig(clip_coef=0.2, clip_value_loss=True, normalize_advantages=False)
    old_values = np.array([0.0, 1.0, 3.0], np.float32)
    params = {"logits": jnp.asarray(LOGITS), "values": jnp.asarray(VALUES)}
    _, info = ppo_loss(params, stub_apply, CATEGORICAL, OBS, ACTIONS, OLD_LOGP, old_values,
                       ADVANTAGES, RETURNS, ALL_ACTIVE, config)
    check(info, "value_loss", 0.5 * 8.48 / 3)
    unclipped = dataclasses.replace(config, clip_value_loss=False)
    _, info = ppo_loss(params, stub_apply, CATEGORICAL, OBS, ACTIONS, OLD_LOGP, old_values,
                       ADVANTAGES, RETURNS, ALL_ACTIVE, unclipped)
    check(info, "value_loss", 0.5 * 4.25 / 3)


def test_target_kl_stops_the_remaining_epochs():
    eager = dataclasses.replace(PPO, learning_rate=1e-2, epochs=8)
    policy, optimizer, state = fresh_state(eager)
    _, metrics = jax.jit(make_update(policy, optimizer, eager, SIZES))(state, random_batch())
    assert float(metrics["epochs_run"]) == 8
    strict = dataclasses.replace(eager, target_kl=1e-6)
    policy, optimizer, state = fresh_state(strict)
    new_state, metrics = jax.jit(make_update(policy, optimizer, strict, SIZES))(
        state, random_batch())
    assert float(metrics["epochs_run"]) == 1, "the first epoch's KL exceeds the target"
    assert int(new_state.version) == 1


def test_annealing_decays_the_step_size_to_zero():
    config = PPOConfig(learning_rate=1e-3, anneal_lr=True, epochs=1, minibatches=1)
    ten_updates = Sizes(trajectory_length=8, batch_envs=4, total_updates=10, reward_scale=1.0,
                        reward_clip=0.0)
    optimizer = make_optimizer(config, ten_updates)
    params = {"w": jnp.ones(3)}
    opt_state = optimizer.init(params)
    grads = {"w": jnp.ones(3)}
    steps = []
    for _ in range(11):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        # The optimizer gives the annealed direction; the update applies the step size.
        steps.append(config.learning_rate * float(jnp.abs(updates["w"][0])))
    assert steps[0] == pytest.approx(1e-3, rel=1e-3)
    assert steps[5] == pytest.approx(0.5e-3, rel=1e-2)
    assert steps[10] == 0.0


def test_value_norm_statistics_are_debiased_and_invert() -> None:
    stats = init_value_norm()
    x = jnp.asarray([90.0, 110.0, 100.0, 100.0])
    ones = jnp.ones(4)
    assert moments(stats) == (0.0, 1.0), "before any update: the identity"
    stats = update_value_norm(stats, x, ones, beta=0.999)
    mean, var = moments(stats)
    assert float(mean) == pytest.approx(100.0, rel=1e-4), "debiased: not pulled to 0"
    assert float(var) == pytest.approx(50.0, rel=1e-2)
    np.testing.assert_allclose(denormalize(stats, normalize(stats, x)), x, rtol=1e-5)
    # rows out of play (weight 0) move nothing
    same = update_value_norm(init_value_norm(), jnp.asarray([100.0, -1e6]),
                             jnp.asarray([1.0, 0.0]), beta=0.999)
    assert float(moments(same)[0]) == pytest.approx(100.0, rel=1e-4)


def test_with_value_norm_the_critic_regresses_standardized_returns() -> None:
    """Returns of tens (rewards of 10): without normalization the value loss is in the
    hundreds; with it the critic's targets are standardized and the statistics, in the
    train state, follow the returns."""
    normed = dataclasses.replace(PPO, value_norm=True)
    batch = random_batch()
    batch = batch._replace(rewards=np.full_like(batch.rewards, 10.0))
    losses = {}
    for config in (PPO, normed):
        optimizer = make_optimizer(config, sizes_for("none"))
        policy, state = small_policy_state(optimizer)
        state = state._replace(extra=init_extra(state.params, config))
        update = jax.jit(make_update(policy, optimizer, config, sizes_for("none")))
        state, metrics = update(state, batch)
        losses[config.value_norm] = float(metrics["value_loss"])
    assert losses[False] > 100 and losses[True] < 10, losses
    mean, _ = moments(state.extra["value_norm"])
    assert float(mean) == pytest.approx(float(metrics["return_mean"]), rel=1e-3)
    assert init_extra(state.params, PPO) == (), "off: no state, checkpoints as before"


def test_a_separate_critic_optimizer_clips_and_scales_the_critic_alone() -> None:
    params = {"params": {"actor": {"w": jnp.ones(2)}, "critic": {"w": jnp.ones(2)}}}
    grads = {"params": {"actor": {"w": jnp.array([0.3, 0.4])},
                        "critic": {"w": jnp.array([3e6, 4e6])}}}

    def first_direction(config: PPOConfig) -> dict:
        optimizer = make_optimizer(config, SIZES)
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
        return updates["params"]

    joint = first_direction(PPOConfig(max_grad_norm=0.5))
    own = first_direction(PPOConfig(max_grad_norm=0.5, critic_optimizer=True,
                                    critic_lr_scale=0.25))
    # Adam's first direction is g / (|g| + eps) of the clipped gradient: clipped together
    # with a critic 10^7 times larger, the actor's share is far below eps.
    assert float(jnp.abs(joint["actor"]["w"]).max()) < 0.2
    np.testing.assert_allclose(own["actor"]["w"], [1.0, 1.0], rtol=1e-3)
    np.testing.assert_allclose(own["critic"]["w"], [0.25, 0.25], rtol=1e-3)


def test_a_critic_optimizer_needs_separate_mlps() -> None:
    from learners.algorithms.ppo_config import check
    from srl_jax.config.schema import ConfigError
    with pytest.raises(ConfigError, match=r"'learner\.ppo\.critic_optimizer' needs separate"):
        check(PPOConfig(critic_optimizer=True), dataclasses.replace(SIZES, shared_torso=True))
