"""Actor side: environments, the env ring and the actor worker. Never imports JAX."""
