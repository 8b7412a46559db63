"""Fetch the datasets a run needs before its first launch: CIFAR-100 (the GPU Training Benchmark
Suite: "auto-downloaded to data/ by default").

A missing CIFAR-100 is downloaded from its published URL into ``data.path``, its MD5 checked
against the published one (torchvision's), and its archive extracted into place:
``<path>/cifar-100-python/{train,test,meta}``. Only folders and regular files under
``cifar-100-python/`` are taken from the archive; it is unpacked beside the target and moved
in whole, so a run never sees half a dataset, and nothing is left behind when anything fails.
Reading the files stays the worker's (``worker.dataset_readers``): nothing is unpickled here.

Where the URL cannot be reached (no internet on a cluster's compute nodes) the run stops before
any launch with one line saying where to put the dataset by hand. ImageNet is never downloaded
(it needs an account); a missing one is reported at planning (``plan.training_cells``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import itertools
import logging
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterable, List, Optional, Tuple

from torchscale.config import dataset_paths
from torchscale.errors import ConfigError
from torchscale.plan.planned_cell import Cell
from torchscale.results.files import open_for_write, refuse_link

log = logging.getLogger("torchscale")

CIFAR100_FOLDER = "cifar-100-python"
MAX_ARCHIVE_BYTES = 512 * 2**20
"""CIFAR-100's archive is 161 MiB; a download past this is not it."""
TIMEOUT_S = 30.0
"""Per connection and per read: an unreachable URL fails within this."""
CHUNK = 1 << 20


def cifar100_roots(sections: Iterable[object]) -> List[Path]:
    """The ``data.path`` of every ``data:`` section (a config's, or each cell's) reading
    CIFAR-100 that is not there yet, each once."""
    roots: List[Path] = []
    for data in sections:
        for source, path in _sources_and_paths(data):
            if source != "cifar100":
                continue
            root = Path(str(path or dataset_paths.DEFAULT_DATA_PATH)).expanduser()
            if root not in roots and dataset_paths.cifar100_file(root) is None:
                roots.append(root)
    return roots


def _sources_and_paths(data: object) -> List[Tuple[object, object]]:
    """A cell's ``data:`` (one source, one path) or a config's sweep of them (lists): every
    combination the plan would make of the two."""
    sources, paths = getattr(data, "source", None), getattr(data, "path", None)
    return list(
        itertools.product(
            sources if isinstance(sources, list) else [sources],
            paths if isinstance(paths, list) else [paths],
        )
    )


def download_notes(sections: Iterable[object]) -> List[str]:
    """What a run would download first (``--dry-run`` says it), from the ``data:`` sections its
    cells read (a config's own: a plan of millions of cells is never walked for it)."""
    return [
        f"CIFAR-100 is not at {root}: the run downloads it there first from "
        f"{dataset_paths.CIFAR100_URL} (MD5 checked)"
        for root in cifar100_roots(sections)
    ]


def fetch_datasets(cells: Iterable[Cell]) -> None:
    """Download every missing dataset the cells read; a failure is one line, nothing kept."""
    for root in cifar100_roots(getattr(cell.settings, "data", None) for cell in cells):
        fetch_cifar100(root)


def fetch_cifar100(root: Path, url: Optional[str] = None, md5: Optional[str] = None) -> None:
    """Download, check and extract CIFAR-100 into ``root`` (``url``/``md5``: the published ones
    unless given)."""
    url = url or dataset_paths.CIFAR100_URL
    md5 = md5 or dataset_paths.CIFAR100_MD5
    created = not root.exists()
    token = f"{os.getpid()}"
    archive = root / f".{CIFAR100_FOLDER}.tar.gz.{token}.part"
    staging = root / f".{CIFAR100_FOLDER}.{token}.extract"
    log.info("CIFAR-100 is not at %s: downloading %s", root, url)
    try:
        root.mkdir(parents=True, exist_ok=True)
        digest = _download(url, archive)
        if digest != md5:
            raise ConfigError(
                f"the CIFAR-100 download from {url} has MD5 {digest}, not the published {md5}: "
                "it is damaged or not CIFAR-100; nothing was kept, run again (or download and "
                f"extract it by hand into {root})"
            )
        _extract(archive, staging)
        _move_into_place(staging / CIFAR100_FOLDER, root)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(
            f"data.source cifar100: no CIFAR-100 at {root}, and it could not be downloaded from "
            f"{url} ({reason}); download the python version where that URL is reachable and "
            f"extract it there, so that {root / CIFAR100_FOLDER / 'train'} exists"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            archive.unlink()
        if staging.is_dir() and not staging.is_symlink():
            shutil.rmtree(staging, ignore_errors=True)
        if created and root.is_dir():
            with contextlib.suppress(OSError):
                root.rmdir()  # only when empty: a download that kept nothing
    log.info("CIFAR-100 is in %s (MD5 %s verified)", root / CIFAR100_FOLDER, md5)


def _download(url: str, archive: Path) -> str:
    """Stream ``url`` into ``archive``; its MD5."""
    request = urllib.request.Request(url, headers={"User-Agent": "torchscale"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return _save(response, archive, url)


def _save(response: BinaryIO, archive: Path, url: str) -> str:
    # MD5 checks the download against the published sum; it protects nothing (FIPS builds
    # refuse it unless told so).
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    with os.fdopen(open_for_write(archive, exclusive=True), "wb") as out:
        while True:
            chunk = response.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ARCHIVE_BYTES:
                raise ConfigError(
                    f"the download from {url} is larger than {MAX_ARCHIVE_BYTES >> 20} MiB: "
                    "not CIFAR-100's archive; nothing was kept"
                )
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _extract(archive: Path, staging: Path) -> None:
    """The archive's folders and regular files under ``cifar-100-python/`` into ``staging``;
    anything else in it (a link, a device, a path outside) means it is not CIFAR-100's."""
    staging.mkdir()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                inside = parts and parts[0] == CIFAR100_FOLDER and ".." not in parts
                if not inside or not (member.isdir() or member.isfile()):
                    raise ConfigError(
                        f"the CIFAR-100 archive holds {member.name!r}, which CIFAR-100's never "
                        "does; nothing was kept"
                    )
                target = staging.joinpath(*parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file's content
                with source, os.fdopen(open_for_write(target, exclusive=True), "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ConfigError(f"the CIFAR-100 download is not a readable tar.gz ({exc})") from None


def _move_into_place(extracted: Path, root: Path) -> None:
    if dataset_paths.cifar100_file(extracted.parent) is None:
        raise ConfigError(f"the CIFAR-100 archive has no {CIFAR100_FOLDER}/train; nothing was kept")
    target = root / CIFAR100_FOLDER
    refuse_link(target)
    if dataset_paths.cifar100_file(root) is not None:
        return  # another node sharing the folder got there first
    if target.exists():
        raise ConfigError(
            f"{target} exists but holds no train file: remove it or complete it by hand"
        )
    os.rename(extracted, target)
