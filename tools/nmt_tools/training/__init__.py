"""Training speed beside PyTorch."""
