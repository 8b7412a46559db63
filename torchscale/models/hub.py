"""Image classifiers from torchvision or timm, offered as ``torchvision/<arch>`` and
``timm/<arch>`` when those packages are installed (they are never required).

Always random init: no weights are downloaded. FLOPs per sample are counted by running the model
once on the meta device under ``FlopCounterMode`` (convolutions, linear layers and attention),
times 3 for training.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from torchscale.errors import ConfigError
from torchscale.models.flops import measured_training_flops
from torchscale.models.spec import ModelSpec

HUB_PACKAGES = ("torchvision", "timm")


def _logits(outputs: Any) -> torch.Tensor:
    """The main logits of a classifier whose training forward may also return auxiliary heads
    (torchvision's inception_v3 and googlenet)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits: torch.Tensor = outputs.logits if hasattr(outputs, "logits") else outputs[0]
    return logits


def _classification_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(_logits(outputs), targets)


def _check_arch(package: str, arch: str, available: List[str]) -> None:
    if arch in available:
        return
    close = get_close_matches(arch, available, n=1)
    hint = f"did you mean '{package}/{close[0]}'? " if close else ""
    raise ConfigError(f"unknown {package} model '{arch}': {hint}see {package}'s list of models")


# Auxiliary classifier heads: their outputs feed no loss, so their parameters get no gradient
# and DDP (find_unused_parameters off) fails the second step. Built without them; init_weights
# says what weights=None means (torchvision warns when it has to guess).
NO_AUX_HEADS: Dict[str, Dict[str, object]] = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


def _torchvision(arch: str) -> Tuple[Callable[[], nn.Module], int]:
    import torchvision

    _check_arch("torchvision", arch, torchvision.models.list_models(module=torchvision.models))
    image_size = 299 if arch == "inception_v3" else 224
    options = NO_AUX_HEADS.get(arch, {})
    return lambda: torchvision.models.get_model(arch, weights=None, **options), image_size


def _timm(arch: str) -> Tuple[Callable[[], nn.Module], int]:
    import timm

    _check_arch("timm", arch, timm.list_models())
    with torch.device("meta"):
        config = timm.create_model(arch, pretrained=False).pretrained_cfg
    image_size = int(config.get("input_size", (3, 224, 224))[-1])
    return lambda: timm.create_model(arch, pretrained=False), image_size


def _has_attention(model: nn.Module) -> bool:
    """Vision transformers (trained with AdamW, no use for channels_last) versus convnets.
    torchvision's ViT uses ``nn.MultiheadAttention``; timm's and Swin's blocks name it ``attn``."""
    return any(
        isinstance(module, nn.MultiheadAttention) or name.rsplit(".", 1)[-1] == "attn"
        for name, module in model.named_modules()
    )


def hub_model(name: str) -> ModelSpec:
    """The spec for ``"torchvision/<arch>"`` or ``"timm/<arch>"`` (1000 ImageNet classes)."""
    package, _, arch = name.partition("/")
    build, image_size = _torchvision(arch) if package == "torchvision" else _timm(arch)
    shape = (3, image_size, image_size)
    with torch.device("meta"):
        attention = _has_attention(build())

    def batch(batch_size: int, device: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(batch_size, *shape, device=device)
        return images, torch.randint(0, 1000, (batch_size,), device=device)

    return ModelSpec(
        name=name,
        build=build,
        batch=batch,
        loss=_classification_loss,
        unit="images",
        flops_per_sample=measured_training_flops(build, lambda: torch.empty(1, *shape)),
        optimizer="adamw" if attention else "sgd",
        input_shape=shape,
        num_classes=1000,
        supports_channels_last=not attention,
        description=f"{package} {arch}, random init, {image_size}x{image_size}",
    )
