"""Training: supervised warm start, value pretraining (and, later, the RL step)."""
