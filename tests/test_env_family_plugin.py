"""The worked example of an env family plugin: 'countdown:<n>', defined in this file only.

A family is a row of the table (`register_family(EnvFamily(...))`, run when the module
is imported) and an implementation that checks its ids, describes their spaces and
makes the actor's splits. An experiment names the module in `plugins`, so the launcher
and every worker process import it before the config is checked; nothing in the package
is edited. A countdown episode lasts exactly n steps and pays 1 a step, so its return
and length are both n whatever the policy does: a run's metrics show that its episodes
were played (tests/test_plugin_kind.py runs `EXPERIMENT`, with a plugin worker kind too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

from actors.env_families.implementation import EnvFamilyImplementation
from actors.env_families.spaces import spec_from_spaces
from actors.env_ring import EnvSplit, OnePolicy
from actors.envs import check_env_id, env_spec, make_split
from srl_jax.config.env_families import EnvFamily, family_of, register_family
from srl_jax.config.loader import load_config
from srl_jax.config.schema import DEFAULT_POLICY, ConfigError, EnvConfig, ExperimentConfig
from srl_jax.dataflow.env_spec import EnvSpec

PREFIX = "countdown:"


class Countdown(gym.Env):
    """An episode of `steps` steps, reward 1 each; it observes the share of steps left."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, steps: int) -> None:
        self.steps, self.t = steps, 0

    def _obs(self) -> np.ndarray:
        return np.array([1 - self.t / self.steps], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple:
        self.t += 1
        return self._obs(), 1.0, self.t >= self.steps, False, {}


class CountdownEnvs(EnvFamilyImplementation):
    """The countdown family: 'countdown:<n>' with n >= 1, one `Countdown` a ring slot."""

    def check_id(self, env: EnvConfig) -> None:
        steps = env.id.removeprefix(PREFIX)
        if not steps.isdigit() or int(steps) < 1:
            raise ConfigError(f"'env.id': '{env.id}' is no countdown: write "
                              f"'{PREFIX}<steps>' with steps >= 1")

    def spec(self, env: EnvConfig, policy: str) -> EnvSpec:
        return spec_from_spaces(Countdown.observation_space, Countdown.action_space, env.id)

    def make_split(self, env: EnvConfig, count: int, seeds: list[int],
                   global_state: bool = False) -> OnePolicy:
        return OnePolicy(EnvSplit([self.make_env(env) for _ in seeds], seeds))

    def make_env(self, env: EnvConfig, render_mode: str | None = None) -> gym.Env:
        return Countdown(int(env.id.removeprefix(PREFIX)))


COUNTDOWN = CountdownEnvs()
register_family(EnvFamily("countdown", (f"{PREFIX}*",), {"gymnasium": f"{__name__}:COUNTDOWN"}))

STEPS = 5
EXPERIMENT = {
    "name": "countdown_ppo",
    "plugins": [__name__],
    "env": {"id": f"{PREFIX}{STEPS}"},
    "actors": {"count": 1, "envs": 4, "splits": 1, "trajectory_length": 8},
    "inference": {"count": 1, "max_batch": 8},
    "learner": {"batch_envs": 4},
    "network": {"hidden": [16]},
    "checkpoint": {"enabled": False},
    "stop": {"env_frames": 1_000, "wall_time_s": 300},
}


def _config(tmp_path: Path, overrides: tuple[str, ...] = ()) -> ExperimentConfig:
    path = tmp_path / "countdown_ppo.yaml"
    path.write_text(yaml.safe_dump(EXPERIMENT))
    return load_config(path, overrides)


def test_the_family_is_found_by_its_ids_and_makes_checks_and_describes_its_envs(
        tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert family_of(config.env).name == "countdown"
    assert family_of(EnvConfig(id="CartPole-v1")).name == "gymnasium"
    assert not family_of(config.env).multi_agent
    check_env_id(config)
    assert env_spec(config.env, DEFAULT_POLICY) == EnvSpec((1,), np.dtype(np.float32), 2,
                                                           continuous=False)
    split = make_split(config.env, 2, [0, 1])
    for _ in range(STEPS - 1):
        assert split.step([[0, 1]]).episode_returns == []
    step = split.step([[1, 0]])
    assert step.episode_returns == [STEPS, STEPS] and step.episode_lengths == [STEPS, STEPS]


def test_its_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^'env.backend': countdown environments step with "
                                          r"'gymnasium', not 'envpool'$"):
        _config(tmp_path, ("env.backend=envpool",))
    config = _config(tmp_path, (f"env.id={PREFIX}none",))
    with pytest.raises(ConfigError, match=r"^'env.id': 'countdown:none' is no countdown"):
        check_env_id(config)
