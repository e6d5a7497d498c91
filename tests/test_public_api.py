"""What is public is imported from `srl_jax`, each name from its module on first use: the
package alone, and its config API, pull in no JAX (an actor imports them)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import sys
import srl_jax
assert "jax" not in sys.modules, "import srl_jax"
assert set(srl_jax.__all__) <= set(dir(srl_jax))
from srl_jax import ConfigError, ExperimentConfig, config_from_dict, load_config, register
from srl_jax import EnvFamily, register_family, analysis
import srl_jax.config.loader
assert load_config is srl_jax.config.loader.load_config
assert isinstance(config_from_dict({"name": "x"}), ExperimentConfig)
assert "jax" not in sys.modules, "the config API"
try:
    srl_jax.no_such_name
except AttributeError as error:
    assert "no_such_name" in str(error)
else:
    raise AssertionError("an unknown name")
from srl_jax import TrainedPolicy, load_policy, load_team
import policy.export
assert load_policy is policy.export.load_policy
print(" ".join(name for name in srl_jax.__all__ if name != "__version__"))
"""


def test_public_names_import_lazily_and_srl_jax_alone_imports_no_jax() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {
        "load_policy", "load_team", "TrainedPolicy", "load_config", "config_from_dict",
        "ExperimentConfig", "ConfigError", "Algorithm", "register", "EnvFamily",
        "register_family"}
