"""Benchmarks of srl_jax: each module prints comparable figures; run one from the repository
root as `python -m bench.<name>` (bench/README.md lists them)."""
