"""``ModelSpec``: everything the DDP worker needs to train one model, and how to count its work.

A spec is plain data plus four callables, so users can add a model without subclassing anything:
point the config at ``"package.module:function"`` where ``function(**options)`` returns a
``ModelSpec``. This module does not import torch; the callables do, when they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

if TYPE_CHECKING:
    import torch
    from torch import nn

Batch = Tuple[Any, Any]
"""``(inputs, targets)``. ``inputs`` is a tensor, a tuple (passed as ``*args``) or a dict
(passed as ``**kwargs``) for the model's forward."""


@dataclass(frozen=True)
class ModelSpec:
    """How to build, feed and score one model, and what one sample costs.

    Attributes:
        name: Shown in results and reports.
        build: Returns a fresh ``nn.Module`` on the CPU, in fp32 (the worker moves and casts it).
        batch: ``batch(batch_size, device) -> (inputs, targets)``, synthetic data already on device.
        loss: ``loss(outputs, targets) -> scalar tensor``.
        unit: What throughput counts: ``"images"``, ``"sequences"`` or ``"tokens"``.
        flops_per_sample: Training FLOPs (forward + backward, multiply-add = 2 FLOPs) per sample.
        units_per_sample: How many ``unit`` one sample is (tokens per sequence for ``"tokens"``).
        optimizer: The optimizer used when the config says ``auto``: ``"sgd"`` or ``"adamw"``.
        input_shape: Shape of one input sample, for datasets read from disk (images: ``(3, H, W)``).
        seq_len: Sequence length for language models, else None.
        num_classes: Classes (or vocabulary size) the targets index.
        supports_channels_last: Whether ``channels_last`` applies (4-D convolutional inputs).
        description: One line for ``--list-models``.
    """

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.device], Batch]
    loss: Callable[[Any, Any], torch.Tensor]
    unit: str
    flops_per_sample: float
    units_per_sample: float = 1.0
    optimizer: str = "sgd"
    input_shape: Optional[Tuple[int, ...]] = None
    seq_len: Optional[int] = None
    num_classes: Optional[int] = None
    supports_channels_last: bool = False
    description: str = field(default="", compare=False)
