"""torchscale: benchmark, profile and validate PyTorch DDP training on GPU clusters.

The Python API (``load``, ``load_steps``, ``run``, ``compare``; see docs/api.md) is imported on
first use, so ``import torchscale`` stays light and free of torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchscale.version import __version__

if TYPE_CHECKING:
    from torchscale.analysis.comparison import Comparison
    from torchscale.api import Results, compare, load, load_steps, run

__all__ = ["Comparison", "Results", "__version__", "compare", "load", "load_steps", "run"]
_API = {"load", "load_steps", "run", "compare", "Results"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from torchscale import api

        return getattr(api, name)
    if name == "Comparison":
        from torchscale.analysis.comparison import Comparison

        return Comparison
    raise AttributeError(f"module 'torchscale' has no attribute {name!r}")
