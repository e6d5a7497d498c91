"""The learner's CPU convolutions (`network.conv: matmul`) give what XLA's convolution
gives, alone and through whole PPO and IMPALA updates, to float tolerance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learners.algorithms import impala, ppo
from learners.algorithms.train_state import Batch, init_train_state
from learners.models.conv import matmul_conv, patches_matmul_conv, xla_conv
from learners.models.networks import init_policy_params, make_policy
from srl_jax.config.checks import validate
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.algorithms import Sizes
from srl_jax.dataflow.env_spec import EnvSpec
from tests.conftest import make_config
from tests.update_checks import single_agent_batch

FRAME = (36, 36, 4)
"""Small frames, for speed: the Nature-CNN's layers leave 1x1x64 of them."""
T, B, ACTIONS = 4, 4, 3


@pytest.mark.parametrize(("height", "kernel", "stride"), [
    (84, 8, 4), (20, 4, 2), (9, 3, 1), (85, 8, 4), (23, 4, 2), (13, 6, 3)])
def test_matmul_conv_matches_xla_values_and_gradients(height: int, kernel: int,
                                                      stride: int) -> None:
    rng = np.random.default_rng(height)
    x = jnp.asarray(rng.normal(size=(3, height, height + 2, 5)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(kernel, kernel, 5, 7)) / kernel, jnp.float32)
    ours = [lambda x, w: matmul_conv(x, w, stride)]
    if stride == 1:
        ours.append(patches_matmul_conv)
    g = jnp.asarray(rng.normal(size=xla_conv(x, w, stride).shape), jnp.float32)
    for conv in ours:
        np.testing.assert_allclose(conv(x, w), xla_conv(x, w, stride), rtol=1e-4, atol=1e-4)
        grads = [jax.grad(lambda x, w, f=f: jnp.sum(f(x, w) * g), (0, 1))(x, w)
                 for f in (conv, lambda x, w: xla_conv(x, w, stride))]
        for mine, xla in zip(*grads, strict=True):
            np.testing.assert_allclose(mine, xla, rtol=1e-4, atol=1e-3)


def test_a_kernel_that_is_not_a_multiple_of_its_stride_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of its stride"):
        matmul_conv(jnp.zeros((1, 9, 9, 4)), jnp.zeros((3, 3, 4, 8)), 2)


def cnn_policy(conv: str, head: str = "actor_critic") -> tuple:
    trains = [] if head == "actor_critic" else ["learner.algorithm=dqn", "replay.count=1"]
    config = make_config(["network.kind=nature_cnn", f"network.conv={conv}",
                          f"network.head={head}", *trains])
    return make_policy(config, EnvSpec(FRAME, np.dtype(np.uint8), ACTIONS, False))


@pytest.mark.parametrize("head", ["actor_critic", "dueling"])
def test_both_convolutions_share_parameters_and_outputs(head: str) -> None:
    (xla_policy, xla_net), (mm_policy, mm_net) = cnn_policy("xla", head), cnn_policy("matmul", head)
    params = init_policy_params(xla_net, FRAME, seed=0)
    mm_params = init_policy_params(mm_net, FRAME, seed=0)
    assert jax.tree.structure(params) == jax.tree.structure(mm_params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(mm_params), strict=True):
        np.testing.assert_array_equal(a, b)  # the same names, shapes and initial values
    frames = np.random.default_rng(2).integers(0, 256, (5, *FRAME), dtype=np.uint8)
    empty = jnp.zeros((5, 0))
    for ours, xla in zip(mm_policy.apply(params, frames, empty)[:2],
                         xla_policy.apply(params, frames, empty)[:2], strict=True):
        np.testing.assert_allclose(ours, xla, rtol=1e-4, atol=1e-5)


def frame_batch(seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    terminated = rng.random((T, B)) < 0.2
    return single_agent_batch(
        obs=rng.integers(0, 256, (T + 1, B, *FRAME), dtype=np.uint8),
        actions=rng.integers(0, ACTIONS, (T, B)).astype(np.int32),
        logp=np.full((T, B), np.log(1 / ACTIONS), np.float32),
        values=rng.normal(size=(T + 1, B)).astype(np.float32),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        terminated=terminated.astype(np.float32), truncated=np.zeros((T, B), np.float32),
        trunc_values=np.zeros((T, B), np.float32), state=np.zeros((1, B, 0), np.float32))


UPDATES = {
    "ppo": (ppo, ppo.PPOConfig(epochs=2, minibatches=2, learning_rate=1e-3)),
    "ppo target_kl": (ppo, ppo.PPOConfig(epochs=3, minibatches=2, learning_rate=3e-2,
                                         target_kl=1e-4)),
    "impala": (impala, impala.ImpalaConfig(minibatches=2, learning_rate=1e-3)),
}


@pytest.mark.parametrize("case", list(UPDATES))
def test_matmul_update_matches_the_xla_update(case: str) -> None:
    """The update with matmul convolutions (what 'auto' picks on a CPU) against XLA's
    convolution (a GPU's or TPU's): the same metrics and parameters after two updates of
    several minibatch steps each; with target_kl, the high learning rate makes both stop
    early."""
    module, config = UPDATES[case]
    sizes = Sizes(trajectory_length=T, batch_envs=B, total_updates=0, reward_scale=1.0,
                  reward_clip=0.0)
    results = []
    for conv in ("matmul", "xla"):
        policy, network = cnn_policy(conv)
        optimizer = module.make_optimizer(config, sizes)
        state = init_train_state(init_policy_params(network, FRAME, seed=1), optimizer, seed=1)
        update = jax.jit(module.make_update(policy, optimizer, config, sizes))
        for seed in range(2):
            state, metrics = update(state, frame_batch(seed))
        results.append((state.params, metrics))
    (ours, our_metrics), (xla, xla_metrics) = results
    assert our_metrics.keys() == xla_metrics.keys()
    for key in our_metrics:
        np.testing.assert_allclose(our_metrics[key], xla_metrics[key], rtol=2e-3, atol=1e-5,
                                   err_msg=key)
    if case == "ppo target_kl":
        assert float(our_metrics["epochs_run"]) < config.epochs, "it did stop early"
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(xla), strict=True):
        # Adam moves a parameter by about the step size whatever its gradient's size, so
        # rounding in a near-zero gradient shows as up to ~1e-4 here; a step missed or
        # taken twice would show as the step size (1e-3 to 3e-2).
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-4)


def test_an_unknown_convolution_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        validate(make_config(["network.conv=fast"]))
    assert str(refused.value) == "'network.conv': unknown 'fast' (known: auto, xla, matmul)"


def test_auto_picks_matmul_on_the_cpu() -> None:
    assert jax.default_backend() == "cpu"
    assert isinstance(cnn_policy("auto")[1], type(cnn_policy("matmul")[1]))
    assert cnn_policy("auto")[1].conv == "matmul" and cnn_policy("xla")[1].conv == "xla"
