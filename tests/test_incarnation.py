"""Incarnations: a restarted or resumed actor seeds its envs anew, reproducibly.

The end-to-end halves are in tests/test_faults.py (an actor the controller
restarts) and tests/test_resume.py (a resumed run): each reads the seeds the
actor logged in each start (`logged_env_seeds`).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from actors.actor_worker import ActorWorker, split_seeds
from actors.envs import env_seed, make_split
from srl_jax.runtime.incarnation import FIRST, RESTARTS_ENV, RESUMES_ENV, Incarnation
from srl_jax.wire.names import FileNameService
from tests.conftest import make_config

LATER = [Incarnation(0, 1), Incarnation(0, 2), Incarnation(1, 0), Incarnation(1, 1),
         Incarnation(2, 0)]


def test_the_first_start_of_a_fresh_run_keeps_the_env_seeds_of_env_seed() -> None:
    config = make_config(["seed=5", "actors.envs=6", "actors.splits=2"])
    assert split_seeds(config, 3, FIRST) == [[env_seed(5, 3, k) for k in range(3)],
                                             [env_seed(5, 3, k) for k in range(3, 6)]]


def test_every_incarnation_of_every_actor_has_its_own_fixed_seeds() -> None:
    config = make_config(["actors.envs=4", "actors.splits=2"])
    seeds = {(actor, incarnation): split_seeds(config, actor, incarnation)
             for actor in range(3) for incarnation in [FIRST, *LATER]}
    flat = [seed for splits in seeds.values() for split in splits for seed in split]
    assert len(set(flat)) == len(flat) == 3 * 6 * 4, "no two envs of any start share a seed"
    assert all(0 <= seed < 2**32 for seed in flat)  # what gymnasium, EnvPool and JAX take
    for (actor, incarnation), splits in seeds.items():  # reproducible: the same every time
        assert split_seeds(config, actor, incarnation) == splits
    assert split_seeds(make_config(["seed=7", "actors.envs=4", "actors.splits=2"]), 0,
                       LATER[0]) != seeds[0, LATER[0]], "the config's seed still counts"


def test_the_incarnation_travels_in_the_environment() -> None:
    for incarnation in [FIRST, *LATER]:
        assert Incarnation.from_env(incarnation.to_env()) == incarnation
    assert Incarnation.from_env({}) == FIRST  # a worker started by hand
    assert Incarnation(1, 2).to_env() == {RESUMES_ENV: "1", RESTARTS_ENV: "2"}
    with pytest.raises(ValueError, match=rf"{RESTARTS_ENV}='x' is not a count"):
        Incarnation.from_env({RESTARTS_ENV: "x"})
    with pytest.raises(ValueError, match="counts up from 0"):
        Incarnation.from_env({RESUMES_ENV: "-1"})


def test_an_actor_process_takes_its_incarnation_from_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESUMES_ENV, "2")
    monkeypatch.setenv(RESTARTS_ENV, "3")
    actor = ActorWorker(make_config(), 0, tmp_path, FileNameService(tmp_path / "names"))
    assert actor.incarnation == Incarnation(2, 3)


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_a_restarted_or_resumed_actor_resets_its_envs_to_new_observations(backend: str) -> None:
    config = make_config(["actors.envs=4", "actors.splits=1", f"env.backend={backend}"])

    def first_obs(incarnation: Incarnation) -> np.ndarray:
        split = make_split(config.env, 4, split_seeds(config, 0, incarnation)[0])
        try:
            return split.obs[0].copy()
        finally:
            split.close()

    starts = {incarnation: first_obs(incarnation) for incarnation in [FIRST, *LATER[:3]]}
    for (a, obs_a), (b, obs_b) in itertools.combinations(starts.items(), 2):
        for env in range(4):
            assert not np.array_equal(obs_a[env], obs_b[env]), (a, b, env)
    np.testing.assert_array_equal(first_obs(LATER[0]), starts[LATER[0]])
