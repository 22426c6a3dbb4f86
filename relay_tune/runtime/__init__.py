"""Runtime: loading compiled kernels, calling and timing them, and running compiled models."""
