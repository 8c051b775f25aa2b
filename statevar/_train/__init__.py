"""Training: Modules that collect variables (as pytrees, with summaries) and the optax-backed
Optimizer with its state."""
