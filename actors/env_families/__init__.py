"""The env families' implementations, one module a family: how each makes, checks and
describes its envs. Which ids belong to which family, with which backends, is the table in
`srl_jax/config/env_families.py`; callers go through `actors/envs.py`."""
