"""The DDP worker torchrun launches for each cell: ``python -m torchscale.worker``."""
