"""srl_jax beside its peers on the same machine: Sample Factory in its own venv, the
single-process cleanrl-style PPO and DQN baselines, torch's CNN update, and the harness
that runs them side by side (`python -m bench.peers.compare`)."""
