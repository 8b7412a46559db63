"""A tiny model for the report tests' real CPU benchmark run (milliseconds per step)."""

from __future__ import annotations

from torchscale.models import ModelSpec

IN_FEATURES = 32
CLASSES = 8


def mlp(width: int = 64) -> ModelSpec:
    import torch
    from torch import nn

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(IN_FEATURES, width), nn.ReLU(), nn.Linear(width, CLASSES))

    def batch(batch_size: int, device: torch.device):
        inputs = torch.randn(batch_size, IN_FEATURES, device=device)
        return inputs, torch.randint(0, CLASSES, (batch_size,), device=device)

    params = IN_FEATURES * width + width + width * CLASSES + CLASSES
    return ModelSpec(
        name="report-mlp",
        build=build,
        batch=batch,
        loss=nn.functional.cross_entropy,
        unit="samples",
        flops_per_sample=6 * params,
    )
