"""srl_jax/core"""
