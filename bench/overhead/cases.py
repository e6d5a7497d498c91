"""What the overhead measurements measure: the null env with CartPole's or Atari's
observation, and the experiment config the server and the learner's intake run with."""

from __future__ import annotations

from typing import Any

NULL_ENV = "bench.null_env:NullEnv-v0"
TRAJECTORY = 32
"""T of the per-sample measurement's chunks (and of bench.scale's sweep)."""
BATCH_CHUNKS = 4
"""Chunks per learner batch (learner.batch_envs = 4 x the columns of a chunk)."""
IN_FLIGHT = 8
"""Requests in flight (one per simulated actor) for the server's CPU per request."""
WINDOWS = 3
"""Windows of `--seconds` each request measurement takes; its figures are the median
window's (by server CPU per request)."""
START_TIMEOUT_S = 150.0
OBS_CASES: dict[str, tuple[tuple[int, ...], str]] = {
    "vector": ((4,), "float32"),
    "frames": ((84, 84, 4), "uint8"),
}
"""Observations of the measurements: CartPole's and Atari's."""


def micro_config(case: dict[str, Any]) -> Any:
    """The experiment config of one measurement: the null env with the case's observation,
    `splits` request slots per actor, and the same-host transport `shared_memory` says
    (off: ZeroMQ over loopback TCP)."""
    from srl_jax.config.operations import TransportConfig
    from srl_jax.config.schema import (
        ActorConfig,
        EnvConfig,
        ExperimentConfig,
        InferenceConfig,
        LearnerConfig,
    )

    return ExperimentConfig(
        env=EnvConfig(id=NULL_ENV, kwargs={"obs_shape": list(case["obs_shape"]),
                                           "obs_dtype": case["obs_dtype"]}),
        actors=ActorConfig(envs=case["envs"] * case.get("splits", 1),
                           splits=case.get("splits", 1), trajectory_length=TRAJECTORY),
        inference=InferenceConfig(max_batch=case.get("max_batch", case["envs"]),
                                  min_padded_batch=1),
        # No update runs, so versions never matter: nothing is ever stale. A short
        # queue bounds memory with Atari-sized chunks (15 MB each).
        learner=LearnerConfig(batch_envs=case["envs"] * BATCH_CHUNKS, sample_queue=8,
                              staleness_cap=10**9, devices=1),
        transport=TransportConfig(shared_memory=case.get("shared_memory", "off")))
