"""CIFAR-100's files in their published format, small: the python version's pickles
(``cifar-100-python/{train,test,meta}``), its ``.tar.gz`` archive, and a local HTTP server on
127.0.0.1 serving a folder (the download is tested against it, never the internet)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import pickle
import tarfile
import threading
from pathlib import Path
from typing import Iterator

import numpy as np

SAMPLES = 24
FOLDER = "cifar-100-python"


def _split(samples: int, seed: int, label: str) -> dict:
    """One split as CIFAR-100 pickles it: bytes keys, ``data`` as N x 3072 uint8 rows (the R, G
    and B planes of a 32 x 32 image)."""
    rng = np.random.default_rng(seed)
    return {
        b"filenames": [f"img_{i}.png".encode() for i in range(samples)],
        b"batch_label": label.encode(),
        b"fine_labels": [(37 * i) % 100 for i in range(samples)],
        b"coarse_labels": [i % 20 for i in range(samples)],
        b"data": rng.integers(0, 256, (samples, 3072), dtype=np.uint8),
    }


def write_cifar100(root: Path, samples: int = SAMPLES) -> np.ndarray:
    """``root/cifar-100-python/{train,test,meta}``; the training images' rows."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    train = _split(samples, 0, "training batch 1 of 1")
    (folder / "train").write_bytes(pickle.dumps(train, protocol=2))
    test = _split(max(1, samples // 4), 1, "testing batch 1 of 1")
    (folder / "test").write_bytes(pickle.dumps(test, protocol=2))
    meta = {
        b"fine_label_names": [f"class_{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"super_{i}".encode() for i in range(20)],
    }
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return train[b"data"]


def cifar100_archive(folder: Path, samples: int = SAMPLES) -> Path:
    """``folder/cifar-100-python.tar.gz``, laid out as the published archive."""
    staging = folder / "staging"
    write_cifar100(staging, samples)
    archive = folder / f"{FOLDER}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staging / FOLDER, arcname=FOLDER)
    return archive


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


@contextlib.contextmanager
def http_server(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (a free port) while the block runs; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Requests are not the test's output."""
