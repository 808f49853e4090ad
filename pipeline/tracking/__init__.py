"""MLflow: each strategy's run (kept locally first, pushed idempotently), its system metrics
and provenance tags, the parent run of a comparison, and the publish command's work."""
