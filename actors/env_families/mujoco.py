"""The MuJoCo family: gymnasium's MuJoCo robots ('HalfCheetah-v5', ...), made as any
gymnasium env (float64 observations seen as float32), checked for the MuJoCo extra."""

from __future__ import annotations

from actors.env_families.gymnasium_envs import GymnasiumEnvs
from srl_jax.config.schema import ConfigError, EnvConfig


class MujocoEnvs(GymnasiumEnvs):
    """Gymnasium envs that need the `mujoco` package."""

    def check_id(self, env: EnvConfig) -> None:
        super().check_id(env)
        try:
            import mujoco  # noqa: F401
        except ImportError:
            raise ConfigError(f"'env.id': '{env.id}' needs the MuJoCo extra: "
                              "pip install 'srl-jax[mujoco]'") from None


MUJOCO = MujocoEnvs()
