"""What the benchmarks share: the machine and results files, launcher runs and their
metrics, the raw env stepping rate."""
