"""torchscale: benchmark, profile and validate PyTorch DDP training on GPU clusters."""

__version__ = "0.1.0"
