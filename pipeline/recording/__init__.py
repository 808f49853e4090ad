"""What a run shows and keeps of itself as it trains: the live progress line, and each epoch's
row written to results/ and handed to MLflow."""
