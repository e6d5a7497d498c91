"""The JaxMARL family: its specs (shapes, masks, global state), a split that resets finished
episodes inside its one jitted step and reports their returns and wins, seeding, and the
one-line refusal of a scenario it does not know. One split per env for the module: a
compile costs seconds."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from actors.env_families.jax_envs import JAXMARL, JaxSplit
from actors.env_ring import RingStep
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.metrics_table import EPISODE_WIN
from srl_jax.runtime.episodes import EpisodeRows

SMAX = EnvConfig(id="jaxmarl:smax", scenario="3m")
OVERCOOKED = EnvConfig(id="jaxmarl:overcooked", kwargs={"max_steps": 3})
"""Episodes of three steps: every one ends cut by the time limit."""
COUNT = 2


@pytest.fixture(scope="module")
def smax() -> JaxSplit:
    return JAXMARL.make_split(SMAX, COUNT, [1, 2], global_state=True)


@pytest.fixture(scope="module")
def overcooked() -> JaxSplit:
    return JAXMARL.make_split(OVERCOOKED, COUNT, [1, 2], global_state=True)


def _types(split: JaxSplit) -> list[tuple]:
    return [(x.shape, x.dtype, x.weak_type) for x in jax.tree.leaves(split._states)]


def _legal_actions(split: JaxSplit, rng: np.random.Generator) -> list[list[int]]:
    """A random legal action for every column of every policy."""
    actions = []
    for obs, mask in zip(split.obs, split.masks, strict=True):
        legal = np.ones((len(obs), 6), bool) if mask is None else mask
        actions.append((rng.random(legal.shape) * legal).argmax(1).tolist())
    return actions


def test_specs_give_shapes_ids_masks_and_the_global_state() -> None:
    smax = JAXMARL.spec(SMAX, "default")  # 3 marines: 75 observed values and 3 ids
    assert (smax.obs_shape, smax.agents, smax.action_dim) == ((78,), 3, 8)
    assert smax.action_masked and smax.global_state_size == 72  # SMAX's world state
    cooked = JAXMARL.spec(OVERCOOKED, "default")  # an image, flattened for the ids
    assert cooked.frame_shape == (5, 4, 26) and cooked.obs_shape == (5 * 4 * 26 + 2,)
    assert not cooked.action_masked and cooked.global_state_size == 2 * 5 * 4 * 26
    hanabi = JAXMARL.spec(EnvConfig(id="jaxmarl:hanabi", agent_id=False), "default")
    assert (hanabi.obs_shape, hanabi.action_dim, hanabi.agents) == ((658,), 21, 2)
    assert hanabi.action_masked


def test_a_bad_scenario_or_env_is_refused_in_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError) as bad:
        JAXMARL.check_id(EnvConfig(id="jaxmarl:smax", scenario="4m"))
    assert str(bad.value).startswith("'env.scenario': 'jaxmarl:smax' has no scenario '4m'")
    assert "3m" in str(bad.value) and "2s3z" in str(bad.value) and "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match=r"^'env\.id': 'jaxmarl:chess' is no JaxMARL"):
        JAXMARL.check_id(EnvConfig(id="jaxmarl:chess"))


def test_smax_columns_carry_masks_padding_the_world_state_and_wins(smax: JaxSplit) -> None:
    assert smax.obs[0].shape == (COUNT * 3, 78) and smax.global_state.shape == (COUNT, 72)
    assert smax.masks[0] is not None and smax.masks[0].shape == (COUNT * 3, 8)
    rng, ended, dead_seen = np.random.default_rng(0), 0, False
    for _ in range(60):
        playing = smax._playing.reshape(-1).copy()
        step = smax.step(_legal_actions(smax, rng))
        result = step.results[0]
        assert result.active is not None  # who was in play acted
        assert np.array_equal(result.active, playing)
        assert result.terminated[~playing].all() and not result.rewards[~playing].any()
        out = ~smax._playing.reshape(-1)  # dead units: zeros but their ids, all legal
        dead_seen = dead_seen or bool(out.any())
        assert not smax.obs[0][out, :75].any() and smax.masks[0][out].all()
        assert len(step.episode_wins) == len(step.episode_returns)
        assert set(step.episode_wins) <= {0.0, 1.0}
        assert len(result.episode_returns) == 3 * len(step.episode_returns)
        if step.episode_returns:  # the team return is its agents' returns summed
            per_env = np.asarray(result.episode_returns).reshape(-1, 3).sum(1)
            assert np.allclose(per_env, step.episode_returns)
        ended += len(step.episode_returns)
    assert ended >= COUNT and dead_seen
    # A reset's states have the types the step gives back, so the step compiles once.
    fresh = JaxSplit(SMAX, COUNT, [1, 2], global_state=True)
    assert _types(fresh) == _types(smax)


def test_an_episode_cut_by_the_time_limit_restarts_inside_the_step(
        overcooked: JaxSplit) -> None:
    rng = np.random.default_rng(0)
    steps: list[RingStep] = [overcooked.step(_legal_actions(overcooked, rng)) for _ in range(3)]
    assert not any(s.episode_returns for s in steps[:2])
    last, columns = steps[-1], COUNT * 2
    result = last.results[0]
    assert result.truncated.all() and not result.terminated.any()
    assert np.array_equal(result.truncated_envs, np.arange(columns))
    assert result.final_obs.shape == (columns, 522)
    assert result.final_global_state is not None and result.final_global_state.any()
    assert last.episode_lengths == [3] * COUNT and last.episode_wins == []  # no wins
    assert len(result.episode_returns) == columns
    assert not np.array_equal(result.final_obs, overcooked.obs[0])
    # The next observations are a new episode's first: it runs its three steps again.
    again = [overcooked.step(_legal_actions(overcooked, rng)) for _ in range(3)]
    assert [s.episode_lengths for s in again] == [[], [], [3] * COUNT]


def test_same_seeds_give_the_same_observations_and_others_differ(smax: JaxSplit) -> None:
    first = JaxSplit(SMAX, COUNT, [7, 8], global_state=True)
    again = JaxSplit(SMAX, COUNT, [7, 8], global_state=True)
    other = JaxSplit(SMAX, COUNT, [9, 10], global_state=True)
    assert np.array_equal(first.obs[0], again.obs[0])
    assert not np.array_equal(first.obs[0], other.obs[0])
    actions = _legal_actions(first, np.random.default_rng(3))
    assert np.array_equal(first.step(actions).results[0].next_obs,
                          again.step(actions).results[0].next_obs)


def test_wins_become_the_rows_win_rate_and_its_rolling_means() -> None:
    rows = EpisodeRows()
    rows.observe({EPISODE_WIN: np.asarray([1.0, 0.0, 1.0, 1.0], np.float32)})
    row: dict = {}
    rows.add_rows(row, lambda name: None)
    assert row["win_rate"] == 0.75 and row["win_rate_last20"] == 0.75
    rows.observe({EPISODE_WIN: np.asarray([0.0], np.float32)})
    later: dict = {}
    rows.add_rows(later, lambda name: None)
    assert later["win_rate"] == 0.0 and later["win_rate_last100"] == 0.6
