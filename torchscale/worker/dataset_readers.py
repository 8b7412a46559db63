"""Datasets with a known on-disk layout (``data.source: cifar100 | imagenet``), see
``torchscale.config.dataset_paths`` for where they are looked for.

CIFAR-100 is read from its documented pickle format (the same arrays torchvision's reader
returns, without its download and checksum logic) through a restricted unpickler: a pickle can
name any function to call, and a dataset file is data, so only what CIFAR's pickles hold (dicts,
lists, bytes, numbers, numpy arrays) is built and anything else is refused. ImageNet's folder
layout goes through torchvision's ``ImageFolder`` when torchvision is installed, else
torchscale's own Pillow reader.
Images are resized to the model's input shape. Labels beyond the model's classes are folded
(``label % classes``): throughput does not depend on label values, and a model with as many
classes as the dataset sees the real labels.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, List, Tuple

import torch
from torch.utils.data import Dataset

from torchscale.config.dataset_paths import cifar100_file, dataset_problem, imagenet_dir

CIFAR_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR_STD = (0.2673, 0.2564, 0.2762)


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


class ImageFolder(Dataset[Tuple[torch.Tensor, int]]):
    """``root/<class>/<image>``: decoded with Pillow, resized to the model's input shape."""

    def __init__(self, root: Path, size: Tuple[int, int]) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples: List[Tuple[Path, int]] = [
            (path, index)
            for index, name in enumerate(classes)
            for path in sorted((root / name).rglob("*"))
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise ValueError(f"data.path {root} has no images in class sub-folders")
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((self.size[1], self.size[0]))
            pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
        tensor = pixels.view(self.size[0], self.size[1], 3).permute(2, 0, 1).float() / 255.0
        return (tensor - 0.45) / 0.225, label


SAFE_PICKLE_GLOBALS = {
    (module, name)
    for numpy_core in ("numpy.core", "numpy._core")  # numpy 1 and numpy 2 spell it differently
    for module, name in (
        (f"{numpy_core}.multiarray", "_reconstruct"),
        (f"{numpy_core}.multiarray", "scalar"),
        (f"{numpy_core}.numeric", "_frombuffer"),
    )
} | {("numpy", "ndarray"), ("numpy", "dtype")}
"""What a pickle of dicts, lists, bytes, numbers and numpy arrays names, and nothing else."""


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as pickle protocol 2 uses it for bytes, and only that."""
    if encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"a pickled bytes object in encoding {encoding!r}")
    return text.encode("latin1")


class DataUnpickler(pickle.Unpickler):
    """Builds dicts, lists, bytes, numbers and numpy arrays; refuses any other global a pickle
    names (``os.system``, ``builtins.eval``, a class with a ``__setstate__`` of its own)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        if (module, name) in SAFE_PICKLE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it names {module}.{name}, which a dataset pickle never needs (only dicts, lists, "
            "bytes, numbers and numpy arrays are read); refused: the file is not CIFAR-100's"
        )


def load_data_pickle(path: Path) -> Any:
    """The object in a dataset pickle at ``path``, built by :class:`DataUnpickler`."""
    with open(path, "rb") as handle:
        try:
            return DataUnpickler(handle, encoding="bytes").load()
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{path}: {exc}") from None


class Cifar100(Dataset[Tuple[torch.Tensor, torch.Tensor]]):
    """The CIFAR-100 training split, normalised, resized to ``size`` when it is not 32 x 32."""

    def __init__(self, root: Path, size: Tuple[int, int], num_classes: int) -> None:
        problem = dataset_problem("cifar100", str(root))
        path = cifar100_file(root)
        if problem or path is None:
            raise FileNotFoundError(problem)
        entry = load_data_pickle(path)
        if not isinstance(entry, dict):
            raise ValueError(f"{path} is not CIFAR-100's python pickle (not a dict)")
        data = entry.get(b"data", entry.get("data"))
        labels = entry.get(b"fine_labels", entry.get("fine_labels"))
        if data is None or labels is None:
            raise ValueError(f"{path} is not CIFAR-100's python pickle (no data / fine_labels)")
        pixels = torch.as_tensor(data, dtype=torch.uint8).reshape(-1, 3, 32, 32)
        if len(labels) != len(pixels):
            raise ValueError(f"{path}: {len(pixels)} images but {len(labels)} labels")
        self.images = pixels
        self.labels = torch.as_tensor(labels, dtype=torch.long) % num_classes
        self.size = size
        self.mean = torch.tensor(CIFAR_MEAN).view(3, 1, 1)
        self.std = torch.tensor(CIFAR_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].float() / 255.0
        if tuple(image.shape[1:]) != self.size:
            image = torch.nn.functional.interpolate(
                image[None], size=self.size, mode="bilinear", align_corners=False
            )[0]
        return (image - self.mean) / self.std, self.labels[index]


class _FoldedLabels(Dataset[Tuple[object, int]]):
    def __init__(self, dataset: Any, num_classes: int) -> None:
        self.dataset = dataset
        self.num_classes = num_classes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Tuple[Any, int]:
        image, label = self.dataset[index]
        return image, int(label) % self.num_classes


def imagenet(root: Path, size: Tuple[int, int], num_classes: int) -> Dataset[Tuple[object, int]]:
    """ImageNet's training folder: torchvision's ImageFolder when installed, else ours."""
    problem = dataset_problem("imagenet", str(root))
    folder = imagenet_dir(root)
    if problem or folder is None:
        raise FileNotFoundError(problem)
    try:
        from torchvision import datasets, transforms
    except ImportError:
        return _FoldedLabels(ImageFolder(folder, size), num_classes)
    transform = transforms.Compose(
        [
            transforms.Resize(size),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    return _FoldedLabels(datasets.ImageFolder(str(folder), transform=transform), num_classes)
