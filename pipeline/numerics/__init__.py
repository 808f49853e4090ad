"""What one training step computes: the model built and parallelised by its strategy, the
optimizer and its schedule, the arithmetic (precision, torch.compile) and the CUDA-graphed
step."""
