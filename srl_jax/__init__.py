"""srl_jax: distributed reinforcement learning over ZeroMQ streams, with JAX learners."""

__version__ = "0.1.0"
