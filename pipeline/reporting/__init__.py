"""The comparison report (compare stage) and the experiments table."""
