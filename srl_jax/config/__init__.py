"""srl_jax/config"""
