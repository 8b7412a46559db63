"""ResNet-50 v1.5 and a tiny ResNet, in plain PyTorch (same layers and parameter count as
torchvision's ``resnet50``, random init, no download).

v1.5 means the stride-2 downsampling of each stage sits in the bottleneck's 3x3 convolution
rather than its first 1x1 (He et al. 2015 put it in the 1x1; torchvision and NVIDIA moved it,
which costs a little more compute and gains accuracy).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from torchscale.errors import ConfigError
from torchscale.models.flops import TRAINING_FACTOR
from torchscale.models.spec import ModelSpec

EXPANSION = 4
"""A bottleneck block's output has 4x the channels of its 3x3 convolution."""


@dataclass(frozen=True)
class ResNetConfig:
    blocks_per_stage: Tuple[int, ...] = (3, 4, 6, 3)
    base_width: int = 64  # channels of the stem and of the first stage's 3x3 convolutions
    num_classes: int = 1000
    image_size: int = 224


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> nn.Sequential:
    conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(out_ch))


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _side(value: Union[int, str, Tuple[int, ...]]) -> int:
    """A square layer's size along one side: ``3`` or ``(3, 3)`` -> 3 (never a padding mode)."""
    return value[0] if isinstance(value, tuple) else int(value)


def _conv_macs(conv_bn: nn.Module, size: int) -> Tuple[int, int]:
    """Multiply-adds of a square convolution on a ``size`` x ``size`` input, and its output size."""
    conv = conv_bn.get_submodule("0")
    assert isinstance(conv, nn.Conv2d)  # _conv_bn's
    kernel, stride, padding = _side(conv.kernel_size), _side(conv.stride), _side(conv.padding)
    out = _out_size(size, kernel, stride, padding)
    per_pixel = conv.out_channels * (conv.in_channels // conv.groups) * kernel * kernel
    return out * out * per_pixel, out


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride) -> 1x1 expand, plus the shortcut."""

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * EXPANSION
        self.reduce = _conv_bn(in_ch, width, 1)
        self.spatial = _conv_bn(width, width, 3, stride)
        self.expand = _conv_bn(width, out_ch, 1)
        # A projection shortcut only where the shape changes, as in the paper's option B.
        self.shortcut: Optional[nn.Module] = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = _conv_bn(in_ch, out_ch, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.reduce(x))
        out = F.relu(self.spatial(out))
        out = self.expand(out)
        identity = x if self.shortcut is None else self.shortcut(x)
        return F.relu(out + identity)

    def forward_macs(self, size: int) -> Tuple[int, int]:
        """Multiply-adds of ``forward`` on a ``size`` x ``size`` input, and the output size."""
        reduce, size_in = _conv_macs(self.reduce, size)
        spatial, size_out = _conv_macs(self.spatial, size_in)
        expand, _ = _conv_macs(self.expand, size_out)
        shortcut = 0 if self.shortcut is None else _conv_macs(self.shortcut, size)[0]
        return reduce + spatial + expand + shortcut, size_out


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        width = config.base_width
        self.stem = nn.Sequential(
            _conv_bn(3, width, 7, stride=2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)
        )
        stages = []
        in_ch = width
        for index, blocks in enumerate(config.blocks_per_stage):
            stage_width = width * 2**index
            stride = 1 if index == 0 else 2
            stage = []
            for block in range(blocks):
                stage.append(Bottleneck(in_ch, stage_width, stride if block == 0 else 1))
                in_ch = stage_width * EXPANSION
            stages.append(nn.Sequential(*stage))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch, config.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        logits: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return logits

    def forward_macs(self, image_size: int) -> int:
        """Multiply-adds of one image's forward pass, from the layers' real shapes: convolutions
        and the classifier, the layers published GMAC figures count."""
        macs, size = _conv_macs(self.stem[0], image_size)
        pool = self.stem[2]
        assert isinstance(pool, nn.MaxPool2d)
        size = _out_size(size, _side(pool.kernel_size), _side(pool.stride), _side(pool.padding))
        for block in self.stages.modules():
            if isinstance(block, Bottleneck):
                block_macs, size = block.forward_macs(size)
                macs += block_macs
        return macs + self.fc.in_features * self.fc.out_features


@cache
def _training_flops(config: ResNetConfig) -> float:
    # From the layer shapes rather than with FlopCounterMode, whose first use in a process costs
    # over a second more; tests check the two agree exactly. Built on the CPU, not the meta
    # device: initialising parameters on meta imports torch._dynamo (2 s per process).
    model = ResNet(config)
    return float(TRAINING_FACTOR * 2 * model.forward_macs(config.image_size))


def resnet_spec(name: str, config: ResNetConfig, description: str) -> ModelSpec:
    """An image-classification ``ModelSpec`` for ``config``: random images, uniform labels."""
    if config.image_size < 32:
        raise ConfigError(
            f"model '{name}': image_size must be at least 32, got {config.image_size}"
        )
    shape = (3, config.image_size, config.image_size)

    def batch(batch_size: int, device: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(batch_size, *shape, device=device)
        labels = torch.randint(0, config.num_classes, (batch_size,), device=device)
        return images, labels

    return ModelSpec(
        name=name,
        build=lambda: ResNet(config),
        batch=batch,
        loss=F.cross_entropy,
        unit="images",
        flops_per_sample=_training_flops(config),
        optimizer="sgd",
        input_shape=shape,
        num_classes=config.num_classes,
        supports_channels_last=True,
        description=description,
    )


def resnet50(image_size: int = 224) -> ModelSpec:
    """ResNet-50 v1.5: 25,557,032 parameters; 4.1 GMACs forward at 224x224, so 24.6 GFLOPs
    per image for training (3 x 2 x 4.1e9)."""
    config = ResNetConfig(image_size=image_size)
    return resnet_spec(
        "resnet50", config, f"ResNet-50 v1.5, {image_size}x{image_size}, 1000 classes"
    )


def resnet_tiny(image_size: int = 32) -> ModelSpec:
    """ResNet-50's layout with one block per stage and a quarter of its width, 10 classes,
    32x32 images: a training step takes 20-35 ms on one CPU core at batch 8-16."""
    config = ResNetConfig(
        blocks_per_stage=(1, 1, 1, 1), base_width=16, num_classes=10, image_size=image_size
    )
    return resnet_spec("resnet-tiny", config, "Tiny ResNet for CPU runs and tests")
