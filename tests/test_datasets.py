"""``data.source: cifar100`` and ``imagenet`` read from local files in their published layouts
(tiny files written here in those formats); a missing dataset is one line, never a download."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.results.store import ExperimentStore
from torchscale.worker.dataset_readers import CIFAR_MEAN, CIFAR_STD, Cifar100, imagenet

runner = CliRunner()
SAMPLES = 24


def write_cifar100(root: Path, samples: int = SAMPLES) -> np.ndarray:
    """CIFAR-100's python version: ``cifar-100-python/train``, a pickle with bytes keys and
    ``data`` as N x 3072 uint8 rows (the R, G and B planes of a 32 x 32 image)."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (samples, 3072), dtype=np.uint8)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    entry = {
        b"filenames": [f"img_{i}.png".encode() for i in range(samples)],
        b"batch_label": b"training batch 1 of 1",
        b"fine_labels": [(37 * i) % 100 for i in range(samples)],
        b"coarse_labels": [i % 20 for i in range(samples)],
        b"data": data,
    }
    (folder / "train").write_bytes(pickle.dumps(entry, protocol=2))
    return data


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
    assert len(dataset) == 6
    labels = sorted(int(dataset[i][1]) for i in range(6))
    assert labels == [0, 0, 0, 1, 1, 1]  # one class per wnid folder, in sorted order
    assert dataset[0][0].shape == (3, 32, 32)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("cifar100", "no CIFAR-100 at {root}; download the python version (https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz) and extract it there, so that {root}/cifar-100-python/train exists (torchscale never downloads)"),
        ("imagenet", "no ImageNet at {root}; put the ILSVRC training images there as {root}/train/<wnid>/<image>.JPEG"),
    ],
)  # fmt: skip
def test_a_missing_dataset_is_one_line_before_any_launch(
    tmp_path: Path, source: str, message: str
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    config = tmp_path / "bench.yaml"
    config.write_text(
        f"experiment_name: data\nmodels: [resnet-tiny]\ndata: {{source: {source}, path: {root}}}\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message.format(root=root) in result.output.replace("\n", "")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_cell_trains_on_cifar100(tmp_path: Path) -> None:
    write_cifar100(tmp_path / "data")
    config = tmp_path / "bench.yaml"
    config.write_text(
        "experiment_name: cifar\nmodels: [resnet-tiny]\nbatch_sizes: [4]\ngpu_counts: [1]\n"
        "warmup_steps: 1\nmeasure_steps: 3\nsync_probe_steps: 0\ncell_timeout_s: 180\n"
        f"data: {{source: cifar100, path: {tmp_path / 'data'}, num_workers: 0}}\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (record,) = ExperimentStore(tmp_path / "out" / "cifar").records()
    assert record.status == "ok" and record.throughput > 0
    assert record.runtime["data"] == "cifar100"
    assert record.per_rank[0].data_ms is not None  # batches came through the DataLoader
