"""What may interrupt a run between steps: a stop asked for (a signal, voted across ranks), and
a fault a test injects at a named point."""
