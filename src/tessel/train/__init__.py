"""Training: the step (engine), the loop, checkpoints, metrics, optimizer and schedule."""
