"""The algorithm registry: name -> (optimizer, update) builders, imported lazily.

An algorithm is one module in `learners/` with `make_optimizer(config)` and
`make_update(policy, optimizer, config)`, which returns a pure
(TrainState, Batch) -> (TrainState, metrics) function for the learner to jit.
"""

from __future__ import annotations

import importlib
from types import ModuleType

MODULES = {"ppo": "learners.ppo", "impala": "learners.impala"}


def algorithm(name: str) -> ModuleType:
    return importlib.import_module(MODULES[name])
