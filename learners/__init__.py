"""Learner side: networks, algorithms as pure functions, the learner and inference workers."""
