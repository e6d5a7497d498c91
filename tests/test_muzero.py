"""MuZero's math: the supports, the search on a known model, the unrolled loss on a case
worked by hand, and the model as the search and the loss use it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learners.algorithms.dqn import init_target
from learners.algorithms.muzero.acting import make_search_act
from learners.algorithms.muzero.loss import UnrollTargets, unrolled_loss
from learners.algorithms.muzero.search import ModelFns, search
from learners.algorithms.muzero.targets import unroll_targets
from learners.algorithms.muzero.update import make_optimizer, make_update
from learners.algorithms.muzero_config import MuZeroConfig
from learners.algorithms.train_state import init_train_state
from learners.models.muzero_model import LogitFns, MuZeroModel
from learners.models.networks import muzero_policy
from learners.models.support import from_support, to_support, two_hot, unrescale
from srl_jax.dataflow.algorithms import Sizes

EPS = 1e-3


def test_two_hot_keeps_the_mean_and_clips_to_the_support() -> None:
    x = jnp.array([-2.5, -0.25, 0.0, 1.75, 3.0, 7.0])
    probs = two_hot(x, 3)
    support = jnp.arange(-3, 4)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose((probs * support).sum(-1), [-2.5, -0.25, 0, 1.75, 3, 3],
                               atol=1e-6)
    assert (probs > 0).sum(-1).max() <= 2, "two neighbours at most"


@pytest.mark.parametrize("x", [-120.0, -3.0, 0.0, 0.4, 17.0, 500.0])
def test_a_target_read_back_from_its_support_is_itself(x: float) -> None:
    probs = to_support(jnp.array([x]), 300, EPS)
    np.testing.assert_allclose(from_support(jnp.log(probs + 1e-30), 300, EPS), [x],
                               rtol=1e-3, atol=1e-3)


def known_model(best: int, actions: int) -> ModelFns:
    """Uniform priors, values 0; the step that takes `best` earns 1, any other 0."""
    def initial(params, obs):
        rows = obs.shape[0]
        return jnp.zeros((rows, 1)), jnp.zeros((rows, actions)), jnp.zeros(rows)

    def recurrent(params, latent, action):
        rows = action.shape[0]
        return latent, (action == best).astype(jnp.float32), jnp.zeros((rows, actions)), \
            jnp.zeros(rows)

    return ModelFns(initial, recurrent)


def test_the_search_picks_the_best_action_of_a_known_model() -> None:
    """Without Gumbel noise every row takes the best action; with it (acting), the noise
    may outbid the search's Q now and then, but the policy it trains towards never does."""
    def run(scale: float) -> object:
        return jax.jit(lambda obs, key: search(known_model(2, 4), {}, obs, key, 16, 0.99,
                                               gumbel_scale=scale))(
            jnp.zeros((64, 3)), jax.random.key(0))

    exact, noisy = run(0.0), run(1.0)
    np.testing.assert_array_equal(exact.action, [2] * 64)
    assert (noisy.action == 2).mean() >= 0.9
    np.testing.assert_array_equal(jnp.argmax(noisy.policy, -1), [2] * 64)
    np.testing.assert_allclose(noisy.policy.sum(-1), 1.0, rtol=1e-5)
    assert (noisy.root_value > 0).all(), "the root's value counts the reward search found"
    assert (noisy.depth >= 1).all()


def test_a_small_difference_in_q_between_two_actions_is_a_small_preference() -> None:
    """The improved policy scales Q by the range of the whole tree's values (MuZero's
    min-max statistics): two actions whose rewards differ by 1% of what the tree's values
    span get a policy that leans, not one that is one-hot (scaled by the two children's
    own range, any difference was a gap of 0 or 1 and the policy 0.995 on one action)."""
    def initial(params, obs):
        rows = obs.shape[0]
        return jnp.zeros((rows, 1)), jnp.zeros((rows, 2)), jnp.full(rows, 10.0)

    def recurrent(params, latent, action):
        rows = action.shape[0]
        return latent, 1.0 + 0.1 * action.astype(jnp.float32), jnp.zeros((rows, 2)), \
            jnp.zeros(rows)

    out = jax.jit(lambda obs, key: search(ModelFns(initial, recurrent), {}, obs, key, 8, 0.99,
                                          gumbel_scale=0.0))(jnp.zeros((4, 3)),
                                                             jax.random.key(0))
    np.testing.assert_array_equal(out.action, [1] * 4)
    assert ((out.policy[:, 1] > 0.5) & (out.policy[:, 1] < 0.9)).all(), out.policy


def test_the_unrolled_loss_of_a_case_worked_by_hand() -> None:
    """Support -1..1 (3 atoms), 2 actions, K = 2. Every head's distribution is known:
    values and rewards (1/4, 1/2, 1/4), policies uniform. A target of 0 is (0, 1, 0), whose
    cross-entropy is ln 2; a target h^-1(0.5) is (0, 1/2, 1/2): 1/2 ln 2 + 1/2 ln 4."""
    atoms = jnp.log(jnp.array([[0.25, 0.5, 0.25]]))

    def initial(params, obs):
        return obs, jnp.zeros((1, 2)), atoms

    def recurrent(params, latent, action):
        return latent, atoms, jnp.zeros((1, 2)), atoms

    half = float(unrescale(jnp.float32(0.5), EPS))
    targets = UnrollTargets(
        actions=jnp.array([[1], [0]]), rewards=jnp.array([[half], [0.0]]),
        values=jnp.array([[0.0], [0.0], [half]]),
        policies=jnp.array([[[1.0, 0.0]], [[0.3, 0.7]], [[0.5, 0.5]]]),
        policy_mask=jnp.array([[1.0], [1.0], [0.0]]), value_mask=jnp.ones((3, 1)),
        reward_mask=jnp.ones((2, 1)), weights=jnp.ones(1))
    loss, metrics = unrolled_loss(LogitFns(initial, recurrent), {}, jnp.zeros((1, 1)),
                                  targets, support_size=1, epsilon=EPS, value_coef=0.25)
    ln2 = np.log(2.0)
    step0 = 0.25 * ln2 + ln2                      # value 0, policy (uniform against any)
    step1 = 1.5 * ln2 + 0.25 * ln2 + ln2          # reward h^-1(0.5), value 0, policy
    step2 = ln2 + 0.25 * 1.5 * ln2                # reward 0, value h^-1(0.5), no policy
    np.testing.assert_allclose(loss, step0 + (step1 + step2) / 2, rtol=1e-5)
    np.testing.assert_allclose(metrics["reward_loss"], (1.5 * ln2 + ln2) / 2, rtol=1e-5)
    np.testing.assert_allclose(metrics["priorities"], [0.0], atol=1e-5)  # predicted 0


def test_unroll_targets_stop_at_the_episode_and_the_sequence() -> None:
    """One column of T = 4 steps that terminates at step 1; K = 2, n = 1, gamma 1/2. Root
    values 10..50, so the value targets are 1 + 20/2, 2 (terminal), 3 + 40/2, 4 + 50/2
    and 50, the last observation's own."""
    policies = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.2, 0.8]])[:, None, :]
    seqs = {"obs": jnp.arange(5.0)[:, None, None], "actions": jnp.array([[0], [1], [0], [1]]),
            "rewards": jnp.array([[1.0], [2.0], [3.0], [4.0]]),
            "terminated": jnp.array([[0.0], [1.0], [0.0], [0.0]]),
            "truncated": jnp.zeros((4, 1)), "trunc_values": jnp.zeros((4, 1)),
            "values": jnp.array([[10.0], [20.0], [30.0], [40.0], [50.0]]),
            "search_policy": policies, "weights": jnp.array([0.5])}
    obs, targets = jax.jit(unroll_targets, static_argnums=(1, 2, 3))(seqs, 2, 1, 0.5)
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 2, 3])  # a row per step t
    # Columns are the start steps t = 0..3; rows the unroll steps k.
    np.testing.assert_allclose(targets.values, [[11, 2, 23, 29], [2, 0, 29, 50], [0, 0, 50, 0]])
    np.testing.assert_array_equal(targets.value_mask, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    np.testing.assert_allclose(targets.rewards, [[1, 2, 3, 4], [2, 0, 4, 0]])
    np.testing.assert_array_equal(targets.reward_mask, [[1, 1, 1, 1], [1, 1, 1, 0]])
    np.testing.assert_array_equal(targets.actions, [[0, 1, 0, 1], [1, 0, 1, 1]])
    np.testing.assert_array_equal(targets.policy_mask, [[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(targets.policies[0], policies[:, 0])
    np.testing.assert_allclose(targets.policies[1, 2], [0.2, 0.8])
    np.testing.assert_allclose(targets.weights, [0.5] * 4)


@functools.cache  # one compile per sizes for every test that reads it
def position_case(reward_scale: float = 1.0, reward_clip: float = 0.0) -> tuple:
    """A MuZero update on B = 4 sampled positions, each with its window of K + n = 5 steps
    (K = 2, n = 3), and its train state with a target network."""
    config = MuZeroConfig(support_size=10, latent=8, unroll_steps=2, n_step=3, gamma=0.9,
                          learning_rate=3e-3, target_update_period=1000)
    sizes = Sizes(trajectory_length=12, batch_envs=4, total_updates=0,
                  reward_scale=reward_scale, reward_clip=reward_clip)
    model = MuZeroModel(action_dim=2, hidden=(16,), latent=8, support_size=10)
    B, W = 4, 5
    keys = jax.random.split(jax.random.key(3), 2)
    actions = jax.random.randint(keys[0], (B, W), 0, 2)
    batch = {"obs": jax.random.normal(keys[1], (B, W + 1, 4)), "actions": actions,
             "rewards": actions.astype(jnp.float32),  # the model can learn: reward = action
             "terminated": jnp.zeros((B, W)).at[0, 3].set(1.0),
             "truncated": jnp.zeros((B, W)).at[1, 1].set(1.0),  # a time limit cuts row 1
             "trunc_values": jnp.zeros((B, W)), "values": jnp.full((B, W + 1), 2.0),
             "final_obs": jax.random.normal(keys[0], (B, W, 4)),
             "search_policy": jax.nn.one_hot(actions, 2), "weights": jnp.ones(B)}
    optimizer = make_optimizer(config, sizes)
    params = {"net": jax.jit(model.init)(jax.random.key(0), batch["obs"][:, 0])}
    noise = iter(jax.random.split(jax.random.key(5), 64))  # heads start at 0: any target's
    params = jax.tree.map(  # cross-entropy against uniform logits is the same
        lambda x: x + 0.3 * jax.random.normal(next(noise), x.shape), params)
    state = init_train_state(params, optimizer, 0, lambda p: init_target(p, config))
    update = jax.jit(make_update(muzero_policy(model), optimizer, config, sizes))
    return update, state, batch


def test_updates_on_positions_lower_the_loss_and_give_each_position_a_priority() -> None:
    update, state, batch = position_case()
    losses = []
    for _ in range(40):
        state, metrics = update(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.6 * losses[0], losses
    assert int(state.version) == 40
    assert metrics["priorities"].shape == (4,) and (metrics["priorities"] > 0).all()


def test_value_targets_bootstrap_from_the_target_network_not_the_stored_values() -> None:
    """Stored root values are as old as the search that made them; the targets bootstrap
    from the target network, so they move with it and ignore what is stored."""
    update, state, batch = position_case()
    _, first = update(state, batch)
    _, stored_changed = update(state, {**batch, "values": batch["values"] * -50.0})
    np.testing.assert_allclose(stored_changed["loss"], first["loss"], rtol=1e-6)
    keys = iter(jax.random.split(jax.random.key(9), 64))
    moved = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(next(keys), x.shape),
                         state.extra["target"])
    _, target_changed = update(state._replace(extra={"target": moved}), batch)
    assert abs(float(target_changed["loss"]) - float(first["loss"])) > 1e-4
    assert float(target_changed["bootstrap_mean"]) != float(first["bootstrap_mean"])


def test_a_time_limit_cut_bootstraps_from_the_target_networks_value_of_its_final_obs() -> None:
    """Where the replay keeps the cut's final observation, the target network values it;
    the acting search's `trunc_values`, as old as the acting, are not read."""
    update, state, batch = position_case()
    _, first = update(state, batch)
    _, stale = update(state, {**batch, "trunc_values": batch["trunc_values"] + 30.0})
    np.testing.assert_allclose(stale["loss"], first["loss"], rtol=1e-6)
    _, moved = update(state, {**batch, "final_obs": batch["final_obs"].at[1, 1].add(3.0)})
    assert abs(float(moved["loss"]) - float(first["loss"])) > 1e-4
    # Without final observations (frame stacks, several agents): the acting search's.
    unkept = {**batch, "final_obs": jnp.zeros((4, 5, 0))}
    _, acting = update(state, unkept)
    _, acting_moved = update(state, {**unkept, "trunc_values": batch["trunc_values"] + 30.0})
    assert abs(float(acting_moved["loss"]) - float(acting["loss"])) > 1e-4


def test_muzero_targets_take_the_rewards_scaled_and_clipped() -> None:
    update, state, batch = position_case()
    _, plain = update(state, batch)
    update_scaled, _, _ = position_case(reward_scale=0.5)
    _, scaled = update_scaled(state, batch)
    _, doubled = update(state, {**batch, "rewards": batch["rewards"] * 0.5})
    np.testing.assert_allclose(scaled["loss"], doubled["loss"], rtol=1e-5)
    assert abs(float(scaled["loss"]) - float(plain["loss"])) > 1e-4
    update_clipped, _, _ = position_case(reward_clip=0.25)
    _, clipped = update_clipped(state, batch)
    _, quarter = update(state, {**batch, "rewards": jnp.minimum(batch["rewards"], 0.25)})
    np.testing.assert_allclose(clipped["loss"], quarter["loss"], rtol=1e-5)


def test_acting_by_search_packs_the_action_its_policy_and_the_root_value() -> None:
    config = MuZeroConfig(support_size=10, latent=8, simulations=4)
    model = MuZeroModel(action_dim=3, hidden=(8,), latent=8, support_size=10)
    obs = jnp.ones((5, 4))
    params = {"net": jax.jit(model.init)(jax.random.key(0), obs)}
    latent, _, _ = jax.jit(lambda p, o: model.apply(p, o, method=MuZeroModel.initial))(
        params["net"], obs)
    assert latent.min() >= 0 and latent.max() <= 1, "latent states scaled to [0, 1]"
    act = make_search_act(model, config)
    legal = jnp.array([[True, False, True]] * 5)
    packed = np.asarray(act(params, obs, jnp.zeros((5, 0)), legal, jax.random.key(1),
                            np.uint32(1)))
    assert packed.shape == (5, 2 + 1 + 0 + 3 + 1)  # logp, value, action, state, policy, depth
    action, policy = packed[:, 2].astype(int), packed[:, 3:6]
    assert ((packed[:, 6] >= 1) & (packed[:, 6] <= 4)).all(), "4 simulations: depth 1 to 4"
    assert set(action) <= {0, 2}, "never an illegal action"
    np.testing.assert_allclose(policy[:, 1], 0.0, atol=1e-6)
    np.testing.assert_allclose(policy.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(packed[:, 0], np.log(policy[np.arange(5), action]), rtol=1e-5)


def test_the_frame_model_reads_frames_through_the_nature_cnn() -> None:
    model = MuZeroModel(action_dim=6, hidden=(8,), latent=8, support_size=5,
                        torso="nature_cnn")
    frames = jnp.zeros((1, 84, 84, 4), jnp.uint8)
    params = jax.jit(model.init)(jax.random.key(0), frames)
    assert "Conv_0" in params["params"]["frames"]
    latent, policy, value = jax.jit(
        lambda p, o: model.apply(p, o, method=MuZeroModel.initial))(params, frames)
    assert latent.shape == (1, 8) and policy.shape == (1, 6) and value.shape == (1, 11)
