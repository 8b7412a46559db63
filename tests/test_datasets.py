"""``data.source: cifar100`` and ``imagenet`` read from local files in their published layouts
(tiny files written here in those formats); a missing ImageNet is one line, never a download
(CIFAR-100's download: test_cifar100_download.py). A real cell training on CIFAR-100 files is
tests/test_seed_runs.py's GPU Training Benchmark Suite run (one launch for both)."""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path

import numpy as np
import torch
from typer.testing import CliRunner

from tests.support.cifar100_files import SAMPLES, write_cifar100
from torchscale.cli.app import app
from torchscale.worker.dataset_readers import CIFAR_MEAN, CIFAR_STD, Cifar100, imagenet

runner = CliRunner()


def write_imagenet(root: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(1)
    for wnid in ("n01440764", "n01443537"):
        folder = root / "train" / wnid
        folder.mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{wnid}_{i}.JPEG", format="JPEG")


def test_cifar100_pixels_and_labels_are_the_files(tmp_path: Path) -> None:
    data = write_cifar100(tmp_path)
    dataset = Cifar100(tmp_path, (32, 32), num_classes=100)
    assert len(dataset) == SAMPLES
    image, label = dataset[5]
    expected = torch.as_tensor(data[5]).reshape(3, 32, 32).float() / 255.0
    mean, std = torch.tensor(CIFAR_MEAN).view(3, 1, 1), torch.tensor(CIFAR_STD).view(3, 1, 1)
    assert torch.allclose(image, (expected - mean) / std)
    assert int(label) == (37 * 5) % 100
    folded = Cifar100(tmp_path, (64, 64), num_classes=10)
    image, label = folded[5]
    assert image.shape == (3, 64, 64) and int(label) == (37 * 5) % 100 % 10


def test_imagenet_folder_layout(tmp_path: Path) -> None:
    write_imagenet(tmp_path)
    dataset = imagenet(tmp_path, (32, 32), num_classes=10)
    assert isinstance(dataset, Sized)
    assert len(dataset) == 6
    labels = sorted(int(dataset[i][1]) for i in range(6))
    assert labels == [0, 0, 0, 1, 1, 1]  # one class per wnid folder, in sorted order
    image = dataset[0][0]
    assert isinstance(image, torch.Tensor) and image.shape == (3, 32, 32)


def test_a_missing_imagenet_is_one_line_before_any_launch(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    config = tmp_path / "bench.yaml"
    config.write_text(
        f"experiment_name: data\nmodels: [resnet-tiny]\ndata: {{source: imagenet, path: {root}}}\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    message = f"no ImageNet at {root}; put the ILSVRC training images there as {root}/train/<wnid>/<image>.JPEG"
    assert message in result.output.replace("\n", "")
    assert not (tmp_path / "out").exists()
