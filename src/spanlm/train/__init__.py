"""The training engine: one loop for every objective, on one process or many (torchrun)."""
