"""Simulated clusters: the hosts and workers that bench.swarm and bench.param_fanout run
against the real controller, name service and host agents."""
