"""A run's training, in each rank's process: its epochs, the step and evaluation of each, and
what the run does at an epoch's end (checkpoint, record) and at its start (resume)."""
