"""srl_jax/runtime"""
