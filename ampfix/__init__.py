"""ampfix: find and fix PyTorch automatic mixed precision (AMP) mistakes."""

__version__ = "0.1.0"
