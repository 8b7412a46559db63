"""A model whose every forward pass sleeps a set time: a step time that a busy 2-core machine
hardly moves, and a planted slowdown (``SLEEPY_EXTRA_MS`` in the environment the ranks inherit)
that a history must find."""

from __future__ import annotations

import os
import time
from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from torchscale.models import ModelSpec

BASE_MS = 50.0
EXTRA_ENV = "SLEEPY_EXTRA_MS"


class _Sleepy(nn.Module):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s = sleep_s
        self.linear = nn.Linear(16, 4)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return self.linear(inputs)


def sleepy() -> ModelSpec:
    sleep_s = (BASE_MS + float(os.environ.get(EXTRA_ENV, "0"))) / 1000.0

    def batch(batch_size: int, device: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch_size, 16, device=device), torch.randint(0, 4, (batch_size,))

    return ModelSpec(
        name="sleepy",
        build=lambda: _Sleepy(sleep_s),
        batch=batch,
        loss=F.cross_entropy,
        unit="samples",
        flops_per_sample=6.0 * 16 * 4,
        optimizer="sgd",
        input_shape=(16,),
        num_classes=4,
        description="a linear layer after a fixed sleep",
    )
