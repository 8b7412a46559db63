"""Where the datasets with a known layout live under ``data.path`` (no torch here: the launcher
checks before any launch, the worker reads from the same place).

- ``cifar100``: CIFAR-100's "python version" (cifar-100-python.tar.gz, extracted):
  ``<path>/cifar-100-python/train`` or ``<path>/train``, a pickle of ``{b"data": uint8 N x 3072
  (R, G, B planes of 32 x 32), b"fine_labels": [N]}``.
- ``imagenet``: the ILSVRC folder layout, ``<path>/train/<wnid>/*.JPEG`` (or ``<path>/<wnid>/...``).

A missing CIFAR-100 is downloaded before the first launch (``launch.dataset_fetch``), MD5
checked; ImageNet is never downloaded: a missing one is one line saying where to put it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
"""The archive's published MD5 (torchvision's ``CIFAR100.tgz_md5``)."""
DEFAULT_DATA_PATH = "data"
"""Where ``data.source: cifar100`` lives (and is downloaded to) without a ``data.path``."""
DOWNLOADED = ("cifar100",)
"""Sources fetched when missing, so not an error at planning."""
IMAGENET_URL = "https://image-net.org/download-images"
LAYOUT_SOURCES = ("cifar100", "imagenet")


def cifar100_file(root: Path) -> Optional[Path]:
    """The training pickle under ``root``, or None."""
    for candidate in (root / "cifar-100-python" / "train", root / "train", root):
        if candidate.is_file():
            return candidate
    return None


def imagenet_dir(root: Path) -> Optional[Path]:
    """The folder whose sub-folders are the classes (``root/train``, else ``root``), or None."""
    for candidate in (root / "train", root):
        if candidate.is_dir() and any(child.is_dir() for child in candidate.iterdir()):
            return candidate
    return None


def dataset_problem(source: str, path: Optional[str]) -> Optional[str]:
    """One line saying where to put the dataset when it is not at ``path``; None when it is."""
    if source not in LAYOUT_SOURCES:
        return None
    root = Path(path or "").expanduser()
    if source == "cifar100":
        if cifar100_file(root) is None:
            return (
                f"data.source cifar100: no CIFAR-100 at {root}; download the python version "
                f"({CIFAR100_URL}) and extract it there, so that "
                f"{root / 'cifar-100-python' / 'train'} exists"
            )
        return None
    if imagenet_dir(root) is None:
        return (
            f"data.source imagenet: no ImageNet at {root}; put the ILSVRC training images there "
            f"as {root / 'train'}/<wnid>/<image>.JPEG ({IMAGENET_URL}; torchscale never "
            "downloads)"
        )
    return None
