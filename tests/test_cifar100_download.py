"""A missing CIFAR-100 is downloaded before the first launch, its MD5 checked, its archive
unpacked safely into ``data.path`` and read by the worker's reader; an unreachable URL is one line
(exit 2, nothing written). The URL is a local HTTP server on 127.0.0.1 serving a small archive in
the published format, never the internet."""

from __future__ import annotations

import io
import socket
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.cifar100_files import SAMPLES, cifar100_archive, http_server, md5
from torchscale.cli.app import app
from torchscale.config import dataset_paths
from torchscale.errors import ConfigError
from torchscale.launch.dataset_fetch import fetch_cifar100
from torchscale.worker.dataset_readers import Cifar100

runner = CliRunner()


def _closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: the connection is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/cifar-100-python.tar.gz"


def test_download_checks_md5_unpacks_and_the_reader_reads_it(tmp_path: Path) -> None:
    archive = cifar100_archive(tmp_path / "served")
    root = tmp_path / "data"
    with http_server(archive.parent) as base:
        fetch_cifar100(root, f"{base}/{archive.name}", md5(archive))
    folder = root / "cifar-100-python"
    assert sorted(p.name for p in folder.iterdir()) == ["meta", "test", "train"]
    assert [p.name for p in root.iterdir()] == ["cifar-100-python"]  # no archive, no temp files
    dataset = Cifar100(root, (32, 32), num_classes=100)  # the worker's reader, the one reading
    assert len(dataset) == SAMPLES
    assert int(dataset[5][1]) == (37 * 5) % 100


def test_a_wrong_checksum_keeps_nothing(tmp_path: Path) -> None:
    archive = cifar100_archive(tmp_path / "served")
    root = tmp_path / "data"
    with http_server(archive.parent) as base, pytest.raises(ConfigError) as info:
        fetch_cifar100(root, f"{base}/{archive.name}", "0" * 32)
    message = str(info.value)
    assert f"has MD5 {md5(archive)}, not the published {'0' * 32}" in message
    assert "\n" not in message
    assert not root.exists()  # the folder it created is gone with the download


def test_an_archive_with_a_member_outside_its_folder_is_refused(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    archive = served / "cifar-100-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        payload = b"not a dataset"
        member = tarfile.TarInfo("cifar-100-python/../../escaped")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    root = tmp_path / "data"
    root.mkdir()
    with http_server(served) as base, pytest.raises(ConfigError, match="never does"):
        fetch_cifar100(root, f"{base}/{archive.name}", md5(archive))
    assert list(root.iterdir()) == []
    assert not (tmp_path / "escaped").exists()


def test_unreachable_url_is_one_line_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _closed_port_url()
    monkeypatch.setattr(dataset_paths, "CIFAR100_URL", url)
    root = tmp_path / "data"
    config = tmp_path / "bench.yaml"
    config.write_text(
        "experiment_name: offline\nmodels: [resnet-tiny]\n"
        f"data: {{source: cifar100, path: {root}}}\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    dry = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"CIFAR-100 is not at {root}: the run downloads it there first from {url}" in (
        dry.output.replace("\n", "")
    )
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "Traceback" not in result.output
    text = result.output.replace("\n", "")
    assert f"no CIFAR-100 at {root}, and it could not be downloaded from {url} (" in text
    assert f"so that {root}/cifar-100-python/train exists" in text
    assert not root.exists() and not (out / "offline").exists()
