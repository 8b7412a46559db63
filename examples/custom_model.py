"""A model of your own for torchscale: a multi-layer perceptron classifying random vectors.

Point a benchmark config at the factory as ``module:function``::

    models: ["examples.custom_model:my_mlp"]

and make the module importable by the worker processes (run from the repository root, or put its
folder on PYTHONPATH). Keyword arguments are optional: torchscale passes a factory only the
options it accepts (``seq_len`` when the config sets one), so ``my_mlp`` gets none of them and
uses its defaults.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from torchscale.models import ModelSpec


def my_mlp(features: int = 256, hidden: int = 512, depth: int = 3, classes: int = 10) -> ModelSpec:
    """An MLP with ``depth`` hidden layers of ``hidden`` units, trained with SGD."""
    widths = [features] + [hidden] * depth + [classes]

    def build() -> nn.Module:
        layers: list = []
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        return nn.Sequential(*layers[:-1])  # no ReLU after the logits

    def batch(batch_size: int, device: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(batch_size, features, device=device)
        targets = torch.randint(0, classes, (batch_size,), device=device)
        return inputs, targets

    # Training FLOPs per sample: each weight is one multiply-add (2 FLOPs) per sample forward,
    # and the backward pass costs twice the forward, so 6 FLOPs per weight.
    weights = sum(fan_in * fan_out for fan_in, fan_out in zip(widths[:-1], widths[1:]))
    return ModelSpec(
        name="my-mlp",
        build=build,
        batch=batch,
        loss=F.cross_entropy,
        unit="samples",
        flops_per_sample=6.0 * weights,
        optimizer="sgd",
        input_shape=(features,),
        num_classes=classes,
        description=f"MLP {features}-{'-'.join([str(hidden)] * depth)}-{classes}",
    )


def sync_bound_mlp() -> ModelSpec:
    """Eight 1024x1024 linear layers (8.4M parameters): at a small batch the step is mostly the
    gradient all-reduce, so DDP's settings matter (the ``torchscale tune`` example)."""
    return my_mlp(features=1024, hidden=1024, depth=7, classes=1024)


def many_bucket_mlp() -> ModelSpec:
    """Thirty-two 512x512 linear layers: as many parameters as ``sync_bound_mlp``, but each
    weight is 1 MB, so at ``bucket_cap_mb: 1`` DDP all-reduces 32 buckets a step where 100 MB
    makes 2. Each all-reduce has a fixed cost (on CPU ranks, waking gloo's threads on busy
    cores), so the bucket size matters more than for eight large layers: on a 2-core VM
    +25..+56% against +3..+34% for ``sync_bound_mlp`` (docs/tune.md)."""
    return my_mlp(features=512, hidden=512, depth=31, classes=512)
