"""MinAtar: the family's spaces come from the game, seeded episodes repeat, its options
reach the game, and a bad id or option is one line naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from actors.env_families.minatar_envs import MinAtarEnv
from actors.envs import check_env_id, env_spec, make_env, make_split
from srl_jax.config.env_families import family_of
from srl_jax.config.loader import SHIPPED_CONFIGS, load_config
from srl_jax.config.schema import ConfigError, EnvConfig
from srl_jax.dataflow.env_spec import EnvSpec, check_network


def minatar(game: str, **kwargs: object) -> EnvConfig:
    return EnvConfig(id=f"minatar:{game}", kwargs=dict(kwargs))


@pytest.mark.parametrize(("game", "channels", "actions"),
                         [("breakout", 4, 3), ("seaquest", 10, 6)])
def test_spaces_are_the_games_channels_and_minimal_actions(game: str, channels: int,
                                                           actions: int) -> None:
    assert family_of(minatar(game)).name == "minatar"
    spec = env_spec(minatar(game))
    assert spec == EnvSpec((10, 10, channels), np.dtype(np.uint8), actions, continuous=False)
    assert env_spec(minatar(game, full_action_space=True)).action_dim == 6
    obs, _ = make_env(minatar(game)).reset(seed=0)
    assert obs.shape == spec.obs_shape and obs.dtype == np.uint8
    assert set(np.unique(obs)) <= {0, 1} and obs.any()


def play(env: MinAtarEnv, seed: int, steps: int) -> list[np.ndarray]:
    """Observations and rewards of `steps` random actions (their own seed) from a reset."""
    obs, _ = env.reset(seed=seed)
    actions = np.random.default_rng(seed).integers(len(env.actions), size=steps)
    seen = [obs]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        seen += [obs, np.array([reward, terminated, truncated])]
        if terminated or truncated:
            seen.append(env.reset()[0])
    return seen


def test_a_seed_repeats_its_episodes_whatever_came_before() -> None:
    env = make_env(minatar("asterix"))
    first = play(env, 3, 300)
    play(env, 4, 77)  # other games between, ending on another last action
    again = play(env, 3, 300)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    other = play(env, 4, 300)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_episodes_end_at_the_time_limit_as_truncated() -> None:
    config = minatar("freeway", max_episode_steps=20)  # Freeway never ends itself this soon
    split = make_split(config, 2, [0, 1])
    for _ in range(19):
        assert split.step([[2, 2]]).episode_lengths == []
    step = split.step([[2, 2]])
    assert step.episode_lengths == [20, 20]
    result = step.results[0]
    assert list(result.truncated) == [True, True] and not result.terminated.any()
    assert len(result.final_obs) == 2


def test_sticky_actions_and_ramping_reach_the_game() -> None:
    env = make_env(minatar("breakout", sticky_action_prob=1.0))
    env.reset(seed=0)
    paddle = env.game.env.pos
    for _ in range(3):  # sticky with probability 1: the first action (no-op) forever
        env.step(2)  # right
    assert env.game.env.pos == paddle
    assert make_env(minatar("asterix", difficulty_ramping=False)).game.env.ramping is False
    default = make_env(minatar("asterix")).game
    assert default.sticky_action_prob == 0.1 and default.env.ramping is True


@pytest.mark.parametrize(("config", "error"), [
    (minatar("breakuot"), r"^'env.id': unknown MinAtar game 'breakuot' \(did you mean "
                          r"'minatar:breakout'\?\); the games are asterix, "),
    (minatar("breakout", stiky_action_prob=0.2), r"^'env.kwargs.stiky_action_prob': not a "
                                                 r"MinAtar option \(did you mean 'sticky_"),
    (minatar("breakout", sticky_action_prob=2), r"^'env.kwargs.sticky_action_prob': a "
                                                r"probability in \[0, 1\], not 2$"),
    (minatar("breakout", max_episode_steps=0), r"^'env.kwargs.max_episode_steps': "),
])
def test_a_bad_id_or_option_is_one_line_naming_the_key(config: EnvConfig, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        env_spec(config)


@pytest.mark.parametrize("name", ["minatar_breakout_ppo", "minatar_breakout_dqn"])
def test_the_configs_run_any_game_by_its_id(name: str) -> None:
    config = load_config(SHIPPED_CONFIGS / f"{name}.yaml", ("env.id=minatar:space_invaders",))
    check_env_id(config)
    assert env_spec(config.env).obs_shape == (10, 10, 6)


def test_the_nature_cnn_is_refused_for_frames_it_cannot_convolve() -> None:
    config = load_config(SHIPPED_CONFIGS / "minatar_breakout_ppo.yaml",
                         ("network.kind=nature_cnn",))
    with pytest.raises(ConfigError, match=r"^'network.kind': 'nature_cnn' needs frames of at "
                                          r"least 36x36; 'minatar:breakout' has \[10, 10, 4\]"):
        check_network(config.network.kind, env_spec(config.env), config.env.id)
