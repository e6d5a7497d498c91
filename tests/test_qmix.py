"""QMIX: the mixer's monotonicity, the team's targets on a case worked by hand, team replay
(one env's agents stored, prioritised and sampled together), legal exploration, the
config's refusals, and a short run on MPE spread through the whole dataflow."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actors.exploration import explore
from learners.algorithms.qmix import team_targets
from learners.models.mixer import MonotonicMixer
from replay.team_buffer import TeamBuffer
from srl_jax.config.loader import load_config
from srl_jax.config.schema import ConfigError
from srl_jax.dataflow.chunk_spec import empty_chunk
from srl_jax.dataflow.env_spec import EnvSpec
from srl_jax.launch import check_before_launch
from tests.conftest import REPO, stop_when

SPREAD = REPO / "configs" / "mpe_spread_qmix.yaml"
TEAM = EnvSpec((4,), np.dtype(np.float32), 3, False, agents=3, state_size=2)
"""Three agents a team, each column with two floats of recurrent state."""


def test_the_mixer_rises_with_every_agents_q_whatever_the_state() -> None:
    """dQ_tot / dQ_a >= 0 on random inputs and random weights: the mixer's weights are
    absolute values of the hypernetworks' outputs."""
    mixer = MonotonicMixer(agents=3, embed=8, hyper_hidden=16)
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (64, 3)) * 5
    state = jax.random.normal(keys[1], (64, 7)) * 3
    init = jax.jit(mixer.init)
    # each row's Q_tot reads only its own row: the gradient of the sum is per row
    slopes_at = jax.jit(jax.grad(lambda q1, p: mixer.apply(p, q1, state).sum()))
    for key in keys[2:]:
        slopes = slopes_at(q, init(key, q, state))
        assert slopes.shape == (64, 3)
        assert bool(jnp.all(slopes >= 0)) and float(slopes.max()) > 0


def test_team_targets_on_a_case_worked_by_hand() -> None:
    """Two agents, four steps, gamma 0.5, 2-step windows. Agent 1 dies after step 0 (out
    of play: reward 0, terminated from then on); the team ends its episode at step 1
    (both terminated), starts a new one at step 2 and is cut by a time limit at step 3."""
    gamma = 0.5
    rewards = jnp.array([[[2.0, 4.0]], [[6.0, 0.0]], [[1.0, 3.0]], [[5.0, 7.0]]])  # [T, B, n]
    active = jnp.array([[[1.0, 1.0]], [[1.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]]])
    terminated = jnp.array([[[0.0, 1.0]], [[1.0, 1.0]], [[0.0, 0.0]], [[0.0, 1.0]]])
    truncated = jnp.array([[[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 0.0]]])
    cut_values = jnp.array([[0.0], [0.0], [0.0], [10.0]])
    next_values = jnp.array([[100.0], [200.0], [300.0], [400.0], [500.0]])
    targets = team_targets(rewards, active, terminated, truncated, cut_values, next_values,
                           2, gamma)
    # step 0: team reward (2 + 4) / 2 = 3, then step 1's 6 (only agent 0 in play), which
    # ends the episode in a terminal state: no bootstrap
    # step 1: 6, terminal
    # step 2: (1 + 3) / 2 = 2, then step 3's 6, cut by a time limit: its bootstrap is the
    # cut's value 10, two steps on
    # step 3: 6, then the cut's 10
    expected = [3 + gamma * 6, 6, 2 + gamma * 6 + gamma ** 2 * 10, 6 + gamma * 10]
    np.testing.assert_allclose(targets[:, 0], expected, rtol=1e-6)


def _team_chunk(T: int, envs: int) -> dict[str, np.ndarray]:
    chunk = empty_chunk(T, envs * TEAM.agents, TEAM)
    columns = np.arange(envs * TEAM.agents)
    chunk["rewards"][:] = columns
    chunk["state"][0] = columns[:, None]
    return chunk


def test_a_team_is_stored_and_sampled_as_its_agents_side_by_side() -> None:
    T, envs, n = 4, 3, TEAM.agents
    buffer = TeamBuffer(1000, T, envs * n, TEAM, 1, 1.0, 1.0, seed=0)
    assert buffer.segments % n == 0
    chunk = _team_chunk(T, envs)
    chunk["active"][:, 3:6] = False  # env 1's agents are all out of play
    assert buffer.insert(chunk) == T * envs * n and buffer.items == envs
    batch = buffer.sample(300, T)
    rewards = batch["rewards"][:, 0].reshape(-1, n)
    assert (rewards == rewards[:, :1] + np.arange(n)).all(), "a team's agents, in order"
    assert set(rewards[:, 0].tolist()) == {0, 6}, "env 1's team is never drawn"
    np.testing.assert_array_equal(batch["state"][:, 0], batch["rewards"][:, 0])
    slots = batch["slots"].reshape(-1, n)
    assert (slots == slots[:, :1]).all() and set(slots[:, 0].tolist()) == {0, 6}
    assert (batch["weights"].reshape(-1, n) == batch["weights"][::n, None]).all()
    buffer.update_priorities(batch["slots"], batch["generations"],
                             np.where(batch["slots"] == 6, 0.0, 1.0))
    assert set(buffer.sample(30, T)["slots"].tolist()) == {0}, "the team's leaf was set"
    with pytest.raises(ValueError, match="not whole teams of 3"):
        buffer.sample(4, T)


def test_random_actions_are_drawn_among_the_legal_ones() -> None:
    legal = np.zeros((2000, 5), bool)
    legal[:, [1, 3]] = True
    legal[0] = False  # a row with no legal action (padding) may take any
    actions = explore(np.zeros(2000, np.int32), np.ones(2000), 5, np.random.default_rng(0),
                      legal)
    assert set(actions[1:].tolist()) == {1, 3}
    assert 0.4 < np.mean(actions[1:] == 1) < 0.6


@pytest.mark.parametrize("override, message", [
    ("learner.batch_envs=32", "'learner.batch_envs' (32) must be a multiple of 3: 'qmix' "
                              "samples whole teams of 3 agents"),
    ("network.critic=local", "'network.critic': the 'qmix' mixer reads the env's global state"),
    ("network.core=none", "'network.core': 'qmix' replays its agents' sequences"),
    ("learner.qmix.n_step=30", "'learner.qmix.n_step' (30) must not exceed the steps each "
                               "sequence trains (25"),
])
def test_bad_qmix_configs_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_before_launch(load_config(SPREAD, [override]))


@pytest.mark.slow
def test_a_short_qmix_run_trains_teams_from_replay(processes, tmp_path) -> None:
    """Actors, an inference server, a team replay server and the QMIX learner on MPE
    spread, until the learner has trained on sampled teams."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "srl_jax.launch", str(SPREAD), "--run-dir", str(run_dir),
            "--quiet"]
    for override in ("actors.count=1", "actors.envs=4", "actors.splits=2",
                     "inference.max_batch=12", "replay.min_size=300", "learner.batch_envs=12",
                     "network.core_size=16", "network.hidden=[16]", "stop.wall_time_s=120"):
        args += ["--set", override]
    process = processes.start(args, log=tmp_path / "launch.log")
    rows = stop_when(process, run_dir, lambda row: row.get("learner_steps", 0) >= 20, 120,
                     tmp_path / "launch.log")
    last = rows[-1]
    assert last["learner_steps"] >= 20
    assert np.isfinite(last["learner/loss"]) and np.isfinite(last["learner/q_mean"])
    assert last["system/wire_rejected"] == 0
    assert any("team_return_mean" in row for row in rows)
