"""Built-in models (plain PyTorch, no downloads) and the ``ModelSpec`` users implement."""

from torchscale.models.spec import Batch, ModelSpec

__all__ = ["Batch", "ModelSpec"]
