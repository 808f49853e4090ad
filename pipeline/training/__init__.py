"""Training one strategy: the launcher (torchrun's elastic agent, in-process), the run's spec
(the Config resolved once), the worker and session each rank runs, and the shared loop with
what it needs (model, precision, optimizer, checkpoints, memory, faults)."""
