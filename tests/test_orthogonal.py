"""Our orthogonal initializer draws what jax's does, and building a policy's parameters
lowers no LAPACK call (whose lowering imports scipy into every JAX worker's start)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from actors.envs import policy_spec
from learners.models.networks import make_policy
from learners.models.orthogonal import orthogonal
from tests.conftest import make_config


@pytest.mark.parametrize(("shape", "scale"), [
    ((4, 64), np.sqrt(2)), ((64, 64), 0.01), ((64, 2), 0.01), ((300, 24), 1.0),
    ((3, 3, 4, 8), np.sqrt(2)), ((128, 200), 1.0), ((200, 129), 1.0)])
def test_it_draws_what_jax_orthogonal_draws(shape: tuple[int, ...], scale: float) -> None:
    key = jax.random.key(7)
    ours = np.asarray(jax.jit(orthogonal(scale), static_argnums=1)(key, shape))
    theirs = np.asarray(jax.nn.initializers.orthogonal(scale)(key, shape))
    np.testing.assert_allclose(ours, theirs, atol=2e-5 * scale)
    flat = ours.reshape(-1, shape[-1]) / scale
    small = min(flat.shape)
    gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
    np.testing.assert_allclose(gram, np.eye(small), atol=1e-5)


@pytest.mark.parametrize("overrides", [[], ["network.core=gru"]])
def test_building_parameters_lowers_no_lapack_call(overrides: list[str]) -> None:
    config = make_config(overrides)
    spec = policy_spec(config)
    _, network = make_policy(config, spec)
    obs = np.zeros((1, *spec.obs_shape), np.float32)
    if overrides:
        inputs = (obs[None], np.zeros((1, network.state_size), np.float32),
                  np.zeros((1, 1), bool))
    else:
        inputs = (obs,)
    text = jax.jit(network.init).lower(jax.random.key(0), *inputs).as_text()
    assert "lapack" not in text.lower()
