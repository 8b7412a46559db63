"""A model for ``torchscale tune``'s tests, used as ``tests.support.tune_models:sleepy_conv`` (the model
where knobs matter is ``examples.custom_model:many_bucket_mlp``).

``sleepy_conv``: a 1x1 convolution whose forward sleeps 100 ms: no DDP knob can change its step.
In channels_last it raises an out-of-memory error, as a layout conversion that does not fit would
on a GPU: the OOM trial the search must record and go past.
"""

from __future__ import annotations

import time
from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from tests.support.fault_models import OutOfMemoryError
from torchscale.models import ModelSpec

SLEEP_S = 0.1


class SleepyConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            raise OutOfMemoryError(
                "CUDA out of memory (injected by tests.support.tune_models.sleepy_conv: channels_last)"
            )
        time.sleep(SLEEP_S)
        return self.conv(x).mean(dim=(2, 3))


def sleepy_conv() -> ModelSpec:
    def batch(batch_size: int, device: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(batch_size, 3, 4, 4, device=device)
        return inputs, torch.randint(0, 4, (batch_size,), device=device)

    return ModelSpec(
        name="sleepy-conv",
        build=SleepyConv,
        batch=batch,
        loss=F.cross_entropy,
        unit="images",
        flops_per_sample=2.0 * 3 * 4 * 16 * 3,
        optimizer="sgd",
        input_shape=(3, 4, 4),
        num_classes=4,
        supports_channels_last=True,
    )
