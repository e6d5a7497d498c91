"""srl_jax/cluster"""
