"""Built-in models that stamp their own forward passes: the outside clock of ``gpu_truth.py``.

Each forward begins by waiting for the device (``torch.cuda.synchronize()``) and appending
``time.perf_counter()`` to ``$TORCHSCALE_STAMPS/rank<RANK>.txt``. Stamp k is therefore the moment
step k-1's work finished on the GPU and step k began, read by code that shares nothing with
torchscale's timing (no CUDA events, no window bookkeeping). Point a config at
``benchmarks.stamped_model:stamped_resnet50`` (or ``stamped_gpt2``) from the repository root.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional, TextIO

import torch
from torch import nn

from torchscale.models import ModelSpec
from torchscale.models.registry import load_model


def _stamp_file() -> Optional[TextIO]:
    folder = os.environ.get("TORCHSCALE_STAMPS")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    # Line-buffered, open as long as the model lives: one short write per forward.
    return open(Path(folder) / f"rank{rank}.txt", "a", buffering=1)


def _stamped(name: str, seq_len: Optional[int]) -> ModelSpec:
    spec = load_model(name, seq_len=seq_len)
    inner_build = spec.build

    def build() -> nn.Module:
        module = inner_build()
        out = _stamp_file()

        def stamp(_module: nn.Module, _args: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if out is not None:
                out.write(f"{time.perf_counter():.9f}\n")

        module.register_forward_pre_hook(stamp)
        return module

    return ModelSpec(
        name=f"stamped-{spec.name}",
        build=build,
        batch=spec.batch,
        loss=spec.loss,
        unit=spec.unit,
        flops_per_sample=spec.flops_per_sample,
        units_per_sample=spec.units_per_sample,
        optimizer=spec.optimizer,
        input_shape=spec.input_shape,
        seq_len=spec.seq_len,
        num_classes=spec.num_classes,
        supports_channels_last=spec.supports_channels_last,
        description=f"{spec.description} (forward stamps)",
    )


def stamped_resnet50() -> ModelSpec:
    """ResNet-50 whose forwards stamp the clock."""
    return _stamped("resnet50", None)


def stamped_gpt2(seq_len: Optional[int] = None) -> ModelSpec:
    """GPT-2 small whose forwards stamp the clock."""
    return _stamped("gpt2", seq_len)


def stamped_resnet_tiny() -> ModelSpec:
    """resnet-tiny whose forwards stamp the clock (CPU check of the script)."""
    return _stamped("resnet-tiny", None)
