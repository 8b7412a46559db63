"""Batches for the worker: synthetic (on device, reused) or read from disk through a DataLoader.

Synthetic data isolates compute and communication from I/O: one batch is made on the device and
fed every step. Disk sources go through a real DataLoader with a DistributedSampler, workers and
pinned memory, so data-loading stalls are measured too (the ``data`` phase of each step).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator, Optional, Sized, Tuple, cast

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from torchscale.config.dataset_paths import LAYOUT_SOURCES
from torchscale.config.settings import CellSettings
from torchscale.models import ModelSpec
from torchscale.runtime.process_group import RankContext
from torchscale.worker.dataset_readers import Cifar100, ImageFolder, imagenet

# One sample: (input, target), as each dataset below gives it.
Samples = Dataset[Tuple[object, ...]]


def _tensor_file(path: Path) -> TensorDataset:
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or "inputs" not in data or "targets" not in data:
        raise ValueError(f"data.path {path} must hold a dict with 'inputs' and 'targets' tensors")
    return TensorDataset(data["inputs"], data["targets"])


def _to_device(batch: Any, device: torch.device, channels_last: bool = False) -> Any:
    """On ``device``; image batches (4-d) in NHWC when the model is: a channels_last model fed
    NCHW inputs converts them inside every forward."""
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=True)
        if channels_last and moved.dim() == 4:
            moved = moved.contiguous(memory_format=torch.channels_last)
        return moved
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(item, device, channels_last) for item in batch)
    return batch


class LoaderBatches:
    """A DataLoader's batches on the device, pass after pass without end (each pass shuffled
    anew by the sampler). :meth:`start_pass` begins a fresh pass where the measured epochs need
    one: an epoch is a whole pass over this rank's shard of the dataset."""

    def __init__(
        self,
        loader: DataLoader[Tuple[object, ...]],
        sampler: DistributedSampler[int],
        device: torch.device,
        channels_last: bool,
    ) -> None:
        self.loader, self.sampler = loader, sampler
        self.device, self.channels_last = device, channels_last
        self.passes = 0
        self._batches: Optional[Iterator[Any]] = None

    def __len__(self) -> int:
        """Batches in one pass."""
        return len(self.loader)

    def start_pass(self) -> Iterator[Any]:
        """Begin the next pass (what was left of the current one is dropped)."""
        self.sampler.set_epoch(self.passes)
        self.passes += 1
        self._batches = iter(self.loader)
        return self._batches

    def __iter__(self) -> LoaderBatches:
        return self

    def __next__(self) -> Tuple[Any, Any]:
        batches = self._batches or self.start_pass()
        try:
            inputs, targets = next(batches)
        except StopIteration:
            inputs, targets = next(self.start_pass())
        return _to_device(inputs, self.device, self.channels_last), _to_device(targets, self.device)


def batch_stream(
    spec: ModelSpec, settings: CellSettings, ctx: RankContext, channels_last: bool = False
) -> Iterator[Any]:
    """An endless iterator of ``(inputs, targets)`` on the rank's device, each batch converted
    to channels_last once (synthetic: the one batch, before the first step)."""
    data = settings.data
    if data.source == "synthetic":
        inputs, targets = spec.batch(settings.batch_size, ctx.device)
        return itertools.repeat((_to_device(inputs, ctx.device, channels_last), targets))
    path = Path(data.path or "")
    images = data.source in ("image_folder", *LAYOUT_SOURCES)
    if images and (not spec.input_shape or len(spec.input_shape) != 3):
        raise ValueError(f"model {spec.name} takes no images (no input_shape (C, H, W))")
    dataset: Samples
    size = (spec.input_shape or (0, 0, 0))[1:]  # set: checked above for image sources
    if data.source == "image_folder":
        dataset = ImageFolder(path, (size[0], size[1]))
    elif data.source in LAYOUT_SOURCES:
        if spec.num_classes is None:
            raise ValueError(f"model {spec.name} has no num_classes to fold the labels into")
        reader = Cifar100 if data.source == "cifar100" else imagenet
        dataset = reader(path, (size[0], size[1]), spec.num_classes)
    else:
        dataset = _tensor_file(path)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=settings.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=sampler,
        num_workers=data.num_workers,
        pin_memory=data.pin_memory and ctx.is_cuda,
        drop_last=True,
        persistent_workers=data.num_workers > 0,
    )
    if len(loader) == 0:
        raise ValueError(
            f"data.path {path} has {len(cast(Sized, dataset))} samples: fewer than one batch of "
            f"{settings.batch_size} per rank"
        )
    return LoaderBatches(loader, sampler, ctx.device, channels_last)
