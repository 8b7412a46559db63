"""Models for the strategy and gradient-check tests, as ``tests.support.strategy_models:<name>``.

``gpt2_10m``: GPT-2's layout with about 11M parameters (FSDP2's sharding of the model state shows
in the records). ``gpt2_scaled_rank``: gpt2-tiny whose output gradient rank 1 (``RANK``) scales by
2 through a tensor hook, before the strategy reduces anything: a planted fault the gradient check
must name. The check builds an unwrapped copy of the model as its reference; that copy must be
healthy, so in each process only every other build of this model plants the hook (a cell builds
its model, then the check builds the reference).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict

import torch
from torch import nn

from torchscale.models.gpt2 import GPT2_SMALL, gpt2_spec, gpt2_tiny
from torchscale.models.spec import ModelSpec

FAULT_FACTOR = 2.0
FAULT_RANK = 1
_BUILDS: Dict[str, int] = {"scaled": 0}


def gpt2_10m() -> ModelSpec:
    """6 layers, hidden 384, 6 heads, vocabulary 512: 11.2M parameters; seq_len 32."""
    config = GPT2_SMALL.resized(6, 384, 6, vocab_size=512, max_positions=512, dropout=0.0)
    return gpt2_spec("gpt2-10m", config, None, 32)


class _ScaledOutputGradient(nn.Module):
    def __init__(self, inner: nn.Module, faulty: bool) -> None:
        super().__init__()
        self.inner = inner
        self.faulty = faulty

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        if self.faulty and torch.is_tensor(out) and out.requires_grad:
            out.register_hook(lambda grad: grad * FAULT_FACTOR)
        return out


def gpt2_scaled_rank() -> ModelSpec:
    base = gpt2_tiny()

    def build() -> nn.Module:
        _BUILDS["scaled"] += 1
        planted = _BUILDS["scaled"] % 2 == 1 and int(os.environ.get("RANK", "0")) == FAULT_RANK
        return _ScaledOutputGradient(base.build(), planted)

    return dataclasses.replace(base, name="gpt2-scaled-rank", build=build)
