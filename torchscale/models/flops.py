"""Training FLOPs per sample: the one place that decides how model work is counted.

Conventions (the ones MFU figures are quoted in): a multiply-add is 2 FLOPs, and training costs
3x the forward pass (forward once, backward twice: gradients for activations and for weights).
Only matrix work counts (convolutions, linear layers, attention matmuls); norms, activations and
elementwise ops are left out, as in published GMAC figures.

Two ways to get the forward figure:

* :func:`measured_forward_flops` runs the model once on the ``meta`` device under
  ``torch.utils.flop_counter.FlopCounterMode``, so the count comes from the real layer shapes and
  nothing is allocated. Used for convolutional models, whose cost depends on the feature-map sizes.
* :func:`transformer_training_flops_per_token` is the closed form from the PaLM paper
  (Chowdhery et al. 2022, appendix B): ``6 N + 12 L H Q T`` per token.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

TRAINING_FACTOR = 3
"""Training FLOPs / forward FLOPs: backward computes two matmuls for each forward one."""


def measured_forward_flops(build: Callable[[], Any], example_inputs: Callable[[], Any]) -> int:
    """Forward FLOPs of ``build()`` on ``example_inputs()``, counted on the meta device.

    Both callables run under ``torch.device("meta")``, so ``example_inputs`` should create its
    tensors with plain factory calls (``torch.empty(1, 3, 224, 224)``) and no explicit device.
    It returns the positional inputs: a tensor or a tuple of them. Count one sample by giving a
    batch of one.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build().eval()  # eval: BatchNorm accepts a batch of one; FLOPs are the same
        inputs = example_inputs()
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*args)
    return int(counter.get_total_flops())


def measured_training_flops(build: Callable[[], Any], example_inputs: Callable[[], Any]) -> float:
    """Training FLOPs per sample: 3x :func:`measured_forward_flops` on a batch of one."""
    return float(TRAINING_FACTOR * measured_forward_flops(build, example_inputs))


def transformer_training_flops_per_token(
    matmul_params: int, layers: int, hidden: int, seq_len: int
) -> float:
    """PaLM appendix B: training FLOPs per token = ``6 N + 12 L H Q T``.

    ``6 N``: each parameter that takes part in a matmul costs 2 FLOPs per token forward and 4
    backward. ``12 L H Q T``: the attention score and value matmuls (``Q K^T`` and ``P V``),
    2 x 2 x T x (H Q) forward per layer and token, times 3 for training. ``H Q`` is the hidden
    size. The attention term counts the full T x T matrix, causal or not, as the paper does.

    ``matmul_params`` (N) is the caller's choice; the built-in language models' is explained in
    :func:`torchscale.models.transformer.matmul_parameters`.
    """
    return float(6 * matmul_params + 12 * layers * hidden * seq_len)


def transformer_training_flops_per_sequence(
    matmul_params: int, layers: int, hidden: int, seq_len: int
) -> float:
    """:func:`transformer_training_flops_per_token` times ``seq_len`` tokens."""
    return seq_len * transformer_training_flops_per_token(matmul_params, layers, hidden, seq_len)


VISION_FORWARD_FLOPS_PER_PARAM = 321.0
"""ResNet-50 at 224x224: 8.2 GFLOPs forward (4.1 GMACs, He et al.) over 25.6 M parameters."""
DEFAULT_SEQ_LEN_ESTIMATE = {"causal-lm": 1024, "masked-lm": 512}


def rough_training_flops(family: str, params: int, seq_len: Optional[int] = None) -> float:
    """Training FLOPs per sample of a built-in model known only by its family and parameter
    count, without building it: for a warning about time (``plan/cpu_size.py``), never for MFU.
    A language model: ``6 N`` per token (PaLM's first term); an image model: ResNet-50's
    forward FLOPs per parameter, times :data:`TRAINING_FACTOR`."""
    if family == "vision":
        return TRAINING_FACTOR * VISION_FORWARD_FLOPS_PER_PARAM * params
    tokens = seq_len or DEFAULT_SEQ_LEN_ESTIMATE.get(family, 512)
    return 6.0 * params * tokens


def count_parameters(module: Any) -> int:
    """Parameters of ``module``, a weight shared by two layers counted once (as HF does)."""
    return sum(p.numel() for p in module.parameters())
