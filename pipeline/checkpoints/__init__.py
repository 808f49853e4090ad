"""A run's state on disk: checkpoints (written, verified, resumed), when they are taken, and
the identity and hardware a checkpoint must match to be resumed."""
