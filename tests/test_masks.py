"""Activity masks, action masks and the centralized critic, on a real PettingZoo env whose
agents appear and die mid-episode and whose legal actions change every step
(tests/masked_env.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zmq

from actors.env_families.multi_agent import MultiAgentSplit
from actors.env_families.parallel_envs import multi_agent_specs
from actors.env_ring import ChunkBuilder
from actors.envs import check_policies
from learners.algorithms import impala, ppo
from learners.algorithms.impala_config import ImpalaConfig
from learners.algorithms.ppo_config import PPOConfig
from learners.algorithms.train_state import init_train_state, to_batch
from learners.models.distributions import CATEGORICAL, mask_logits
from learners.models.networks import Policy, init_policy_params, make_policy
from learners.models.param_codec import params_to_arrays
from learners.training.learner import check_splits, chunk_inputs
from policy.acting import make_runner
from policy.inference_server import InferenceServer
from policy.policy_runner import PolicyRunner
from srl_jax.config.schema import ConfigError, EnvConfig, ExperimentConfig
from srl_jax.dataflow.algorithms import Sizes
from srl_jax.dataflow.env_spec import EnvSpec, with_network
from srl_jax.dataflow.stream_table import INFERENCE, PARAMS
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import Transport
from tests.conftest import make_config, stop_when
from tests.update_checks import check_pinned

MASKED = "pettingzoo:tests.masked_env"
T, ENVS = 8, 3


def test_masked_actions_are_never_sampled_and_have_log_probability_minus_inf():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(4096, 6)) * 3, jnp.float32)
    mask = jnp.asarray(rng.random((4096, 6)) < 0.5).at[:, 0].set(True)  # one legal at least
    masked = mask_logits(logits, mask)
    actions = np.asarray(CATEGORICAL.sample(jax.random.key(7), masked))
    assert np.asarray(mask)[np.arange(4096), actions].all(), "an illegal action was sampled"
    log_probs = np.stack([np.asarray(CATEGORICAL.log_prob(masked, jnp.full(4096, a)))
                          for a in range(6)], 1)
    assert np.isneginf(log_probs[~np.asarray(mask)]).all()
    assert np.isfinite(log_probs[np.asarray(mask)]).all()
    np.testing.assert_allclose(np.exp(log_probs).sum(1), 1.0, rtol=1e-5)
    assert np.isfinite(np.asarray(CATEGORICAL.entropy(masked))).all()
    assert (np.asarray(CATEGORICAL.mode(masked)) == np.asarray(
        jnp.argmax(jnp.where(mask, logits, -1e30), -1))).all()

    def loss(x: jax.Array) -> jax.Array:  # what PPO differentiates: log-probs and entropy
        out = mask_logits(x, mask)
        return (CATEGORICAL.log_prob(out, jnp.asarray(actions)).sum()
                + CATEGORICAL.entropy(out).sum())

    grads = np.asarray(jax.grad(loss)(logits))
    assert np.isfinite(grads).all() and (grads[~np.asarray(mask)] == 0).all()
    illegal = np.argmin(np.asarray(mask), 1)  # an illegal action of each row (0 is legal)
    has_illegal = ~np.asarray(mask).all(1)
    grads = np.asarray(jax.grad(lambda x: jnp.where(
        has_illegal, 0.0, CATEGORICAL.log_prob(mask_logits(x, mask), jnp.asarray(illegal))
    ).sum())(logits))
    assert np.isfinite(grads).all(), "the gradient of an illegal action's -inf is finite"


def test_a_row_without_legal_actions_and_an_empty_mask_leave_the_logits_alone():
    logits = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(mask_logits(logits, jnp.zeros((2, 0), bool)), logits)
    out = mask_logits(logits, jnp.asarray([[False, False], [True, False]]))
    np.testing.assert_array_equal(np.asarray(out)[0], [1.0, 2.0])
    assert np.isneginf(np.asarray(out)[1, 1])


@pytest.mark.parametrize("mask_in", ["obs", "infos"])
def test_the_split_reads_masks_pads_agents_out_of_play_and_carries_the_global_state(mask_in):
    config = EnvConfig(id=MASKED, kwargs={"mask_in": mask_in})
    spec = multi_agent_specs(config)["default"]
    assert spec.action_masked and spec.agents == 2 and spec.obs_shape == (7,)  # 5 + ids
    assert spec.global_state_size == 10, "no state(): both agents' observations"
    split = MultiAgentSplit(config, 1, [0], global_state=True)
    np.testing.assert_array_equal(split.masks[0], [[1, 1, 0, 0], [1, 1, 1, 1]])
    actives = []
    for _ in range(8):
        legal = [int(np.flatnonzero(row)[0]) for row in split.masks[0]]
        result = split.step([legal]).results[0]
        actives.append(result.active.tolist())
        inactive = ~result.active
        assert result.terminated[inactive].all() and (result.rewards[inactive] == 0).all()
    assert [a[1] for a in actives] == [False, False, True, True, True, False, False, False]
    assert all(a[0] for a in actives)
    np.testing.assert_array_equal(result.final_global_state[0, :5], [1, 0, 0, 0, 1])
    np.testing.assert_array_equal(result.truncated, [True, False])
    split.close()


def _chunk(critic: str, seed: int = 0) -> tuple:
    """A real [T+1, 2 * ENVS] chunk of the masked env, random legal actions: (config,
    spec, batch arrays)."""
    config = make_config([f"env.id={MASKED}", "network.hidden=[16]", f"network.critic={critic}",
                          "learner.normalize_obs=true"])
    spec = with_network(multi_agent_specs(config.env)["default"], config.network)
    split = MultiAgentSplit(config.env, ENVS, list(range(ENVS)), global_state=True)
    builder = ChunkBuilder(T, split.obs[0], spec, split.masks[0], split.global_state)
    rng = np.random.default_rng(seed)
    chunk, truncated = None, 0
    while chunk is None:
        n = len(split.obs[0])
        legal = [int(rng.choice(np.flatnonzero(row))) for row in split.masks[0]]
        chunk = builder.on_policy(np.asarray(legal, np.int32), np.log(np.full(n, 0.5)),
                                  rng.normal(size=n), 0, rng.normal(size=truncated),
                                  np.zeros((n, 0)))
        result = split.step([legal]).results[0]
        builder.on_step(result)
        truncated = len(result.truncated_envs)
    split.close()
    assert not chunk["active"].all() and chunk["active"].any()
    return config, spec, chunk


def _garbled(chunk: dict, rng: np.random.Generator) -> dict:
    """`chunk` with everything an inactive row holds replaced by noise (its flags stay:
    an actor always marks padding terminated), and one more env of padding columns."""
    out = {name: array.copy() for name, array in chunk.items()}
    inactive = ~out["active"].astype(bool)
    for name in ("logp", "values", "rewards", "trunc_values"):
        out[name][:len(inactive)][inactive] = rng.normal(size=inactive.sum())
    out["obs"][:-1][inactive] = rng.normal(size=(inactive.sum(), out["obs"].shape[-1]))
    out["actions"][inactive] = rng.integers(0, 4, inactive.sum())
    columns = out["obs"].shape[1]
    agents = columns // out["global_state"].shape[1]
    for name, array in out.items():  # a whole env out of play
        extra = rng.normal(size=(array.shape[0], agents if array.shape[1] == columns else 1,
                                 *array.shape[2:])).astype(array.dtype)
        if name == "active":
            extra[:] = 0
        elif name == "terminated":
            extra[:] = 1
        elif name in ("truncated", "action_mask"):
            extra[:] = name == "action_mask"
        elif name == "actions":
            extra = rng.integers(0, 4, extra.shape).astype(array.dtype)
        out[name] = np.concatenate([array, extra], 1)
    return out


def _update(algorithm: str, policy: Policy, columns: int) -> tuple:
    """(optimizer, jitted update) of `algorithm` for a [T+1, columns] batch of this env:
    PPO of two epochs or IMPALA, one minibatch each."""
    sizes = Sizes(trajectory_length=T, batch_envs=columns, total_updates=0, reward_scale=1.0,
                  reward_clip=0.0)
    if algorithm == "ppo":
        conf, module = PPOConfig(epochs=2, minibatches=1), ppo
    else:
        conf, module = ImpalaConfig(minibatches=1), impala
    optimizer = module.make_optimizer(conf, sizes)
    return optimizer, jax.jit(module.make_update(policy, optimizer, conf, sizes))


@pytest.mark.parametrize("algorithm,critic", [("ppo", "local"), ("ppo", "global"),
                                              ("impala", "global")])
def test_inactive_rows_change_neither_parameters_nor_statistics_nor_metrics(algorithm,
                                                                           critic):
    """The same update on the same chunk, once with noise in its padding rows and a
    whole env of padding columns added, gives the same parameters, observation
    statistics and metrics."""
    config, spec, chunk = _chunk(critic)
    garbled = _garbled(chunk, np.random.default_rng(1))
    policy, network = make_policy(config, spec)
    results = []
    for arrays in (chunk, garbled):
        optimizer, update = _update(algorithm, policy, arrays["actions"].shape[1])
        state = init_train_state(init_policy_params(network, spec.obs_shape, 3), optimizer, 3)
        new_state, metrics = update(state, to_batch(arrays))
        results.append((jax.device_get(new_state.params), jax.device_get(metrics)))
    (params, metrics), (padded_params, padded_metrics) = results
    assert float(params["obs_count"]) == chunk["active"].sum(), "active rows only"
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(padded_params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    assert metrics.keys() == padded_metrics.keys()
    for key in metrics:
        np.testing.assert_allclose(metrics[key], padded_metrics[key], rtol=2e-5, atol=2e-6,
                                   err_msg=key)
    init = init_policy_params(network, spec.obs_shape, 3)  # the update did train
    assert not np.allclose(jax.tree.leaves(init["net"])[0],
                           jax.tree.leaves(params["net"])[0])


PINNED = {  # what the updates computed before their sample preparation moved to prepare.py
    "ppo": {"loss": 1.0554838, "pg_loss": -1.6206503e-3, "value_loss": 2.1280713,
            "entropy": 0.69312644, "moved": 2.4149497e-3},
    "impala": {"loss": 2.4628983, "pg_loss": 1.1396674, "value_loss": 2.6603246,
               "entropy": 0.69312775, "moved": 1.1894577e-3},
}


@pytest.mark.parametrize("algorithm", sorted(PINNED))
def test_masks_and_the_centralized_critic_give_the_numbers_they_always_have(algorithm):
    config, spec, chunk = _chunk("global")
    policy, network = make_policy(config, spec)
    optimizer, update = _update(algorithm, policy, chunk["actions"].shape[1])
    state = init_train_state(init_policy_params(network, spec.obs_shape, 3), optimizer, 3)
    check_pinned(update, state, to_batch(chunk), PINNED[algorithm])


def test_the_centralized_critic_reads_the_global_state_and_acting_needs_none():
    config, spec, _ = _chunk("global")
    policy, network = make_policy(config, spec)
    assert policy.critic is not None and policy.critic_agents == 2 and policy.critic_ids
    params = init_policy_params(network, spec.obs_shape, 3)
    obs = jnp.zeros((4, *spec.obs_shape))
    _, values, _ = policy.apply(params, obs, jnp.zeros((4, 0)))
    assert (np.asarray(values) == 0).all(), "acting has no global state: no values"
    states = jnp.asarray(np.random.default_rng(0).normal(size=(4, 12)), jnp.float32)
    values = np.asarray(policy.critic(params, states))
    assert values.shape == (4,) and len(set(values.round(6))) == 4


@pytest.mark.slow
def test_a_masked_env_whose_agents_come_and_go_trains_end_to_end(processes, tmp_path):
    """PPO with a centralized critic on the masked env: actors, servers, learner and
    evaluator sample only legal actions (the env raises on any other: a worker would
    crash and restart), padding rows train nothing, and `srl_jax.evaluate` plays it."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", "mpe_spread_ppo", "--run-dir", str(run_dir),
            "--quiet"]
    for override in (f"env.id={MASKED}", "env.kwargs={}", "actors.count=1", "actors.envs=4",
                     "actors.splits=2", "actors.trajectory_length=8", "inference.max_batch=16",
                     "learner.batch_envs=8", "learner.ppo.epochs=2", "network.critic=global",
                     "evaluation.every_updates=2", "evaluation.episodes=2",
                     "stop.env_frames=10000000"):
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    rows = stop_when(process, run_dir, lambda row: row.get("learner_steps", 0) >= 4
                     and "eval_return_mean" in row, 120, tmp_path / "launch.log")
    last = rows[-1]
    assert last["system/restarts"] == 0, "no worker met an illegal action"
    assert last["system/wire_rejected"] == 0
    returned = [r for r in rows if "episode_return_mean" in r]
    assert returned and all(0 <= r["episode_return_mean"] <= 8 for r in returned)
    entropies = [r["learner/entropy"] for r in rows if "learner/entropy" in r]
    assert entropies and all(0 < e <= np.log(2) + 1e-3 for e in entropies), \
        "two legal actions at most"
    evaluate = subprocess.run([sys.executable, "-m", "srl_jax.evaluate", str(run_dir),
                               "--episodes", "3", "--stochastic"],
                              capture_output=True, text=True, timeout=120)
    assert evaluate.returncode == 0, evaluate.stderr
    assert len([line for line in evaluate.stdout.splitlines()
                if line.startswith("episode ")]) == 3


def seeded_runner(config: ExperimentConfig, spec: EnvSpec, sampling_seed: int, min_size: int,
                  max_size: int, published: bool) -> PolicyRunner:
    """The policy with the seed's parameters, taken as if the learner had published them
    (`published` or not), so that the server acts without one."""
    runner = make_runner(config, spec, sampling_seed, min_size, max_size)
    runner.set_params(params_to_arrays(runner.params), version=0)
    return runner


def test_the_server_samples_legal_actions_and_drops_requests_whose_mask_does_not_fit(
        tmp_path):
    config = make_config([f"env.id={MASKED}", "network.hidden=[16]", "inference.max_batch=8",
                          "inference.min_padded_batch=2"])
    names = FileNameService(tmp_path / "names")
    context = zmq.Context.instance()
    params = make_socket(context, PARAMS.bind_type)
    Transport(context).bind(params, names, PARAMS.key())
    server = InferenceServer(config, 0, tmp_path, names, runner_factory=seeded_runner)
    server.setup()
    dealer = make_socket(context, INFERENCE.connect_type)
    dealer.connect(names.lookup(INFERENCE.key(index=0), timeout_s=5))
    try:
        rng = np.random.default_rng(0)
        obs = rng.random((6, 7)).astype(np.float32)
        mask = np.zeros((6, 4), bool)
        mask[np.arange(6), rng.integers(0, 4, 6)] = True  # one legal action a row
        for bad in ({"action_mask": mask[:, :3]}, {"action_mask": mask.astype(np.uint8)},
                    {"action_mask": mask[:5]}, {}):
            send(dealer, "infer_request", {"split": 0, "seq": 0}, {"obs": obs, **bad})
        for seq in range(1, 4):
            send(dealer, "infer_request", {"split": 0, "seq": seq},
                 {"obs": obs, "action_mask": mask})
        replies = []
        deadline = time.monotonic() + 20
        while len(replies) < 3:
            assert time.monotonic() < deadline, "the good requests were not all answered"
            server.run_once()
            while dealer.poll(0):
                received = receive(dealer, INFERENCE.connecter_receives, RejectCounter())
                replies.append(received[1])
        assert [r.meta["seq"] for r in replies] == [1, 2, 3], "no reply to a bad mask"
        for reply in replies:
            np.testing.assert_array_equal(reply.arrays["action"], np.flatnonzero(mask) % 4)
            np.testing.assert_allclose(reply.arrays["logp"], 0.0, atol=1e-6)
        assert server.rejects.count == 4
    finally:
        server.close()
        dealer.close(linger=0)
        params.close(linger=0)


def test_a_batch_whose_env_columns_do_not_split_over_the_devices_is_refused():
    spec = dataclasses.replace(multi_agent_specs(EnvConfig(id=MASKED))["default"], agents=3)
    check_splits(chunk_inputs(T, 12, spec), 4)  # 12 agent columns, 4 env columns
    with pytest.raises(ConfigError, match=r"'global_state' has 4 columns .* over its 3 devices"):
        check_splits(chunk_inputs(T, 12, spec), 3)


def test_a_q_network_on_a_masked_env_is_refused_before_launch():
    config = make_config([f"env.id={MASKED}", "learner.algorithm=dqn", "network.head=q",
                          "actors.epsilon=0.4", "replay.count=1"])
    with pytest.raises(ConfigError, match=r"'network\.head': 'q' does not read action masks"):
        check_policies(config)
