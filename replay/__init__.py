"""Replay servers: prioritized, rate-limited storage of actors' chunks for off-policy learners."""
