"""Where a learner's training batches come from: the sample stream or replay."""
