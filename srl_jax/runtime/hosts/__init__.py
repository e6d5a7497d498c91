"""Services that run once per host of a run: the host agent and its parameter relays."""
