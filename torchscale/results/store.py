"""The experiment folder on disk: written so that results are never lost or corrupted.

Layout of ``<output-dir>/<experiment_name>/``::

    manifest.json        resolved config, versions, host, GPUs (rewritten atomically)
    results.jsonl        one record per finished cell, appended and fsynced: the source of truth
    summary.csv          a flat table derived from results.jsonl (rewritten atomically)
    cells/<cell_id>/     cell.json, result.json, torchrun and per-rank logs, error files, traces
    .lock                held while a benchmark writes here

A crash can at worst leave a partial last line in ``results.jsonl``; readers skip it with a warning
and the next append starts on a fresh line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

from torchscale.errors import TorchscaleError
from torchscale.results.schema import ResultBase, parse_record

log = logging.getLogger("torchscale")

MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.csv"
CELLS = "cells"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, document: Any) -> None:
    atomic_write_text(path, json.dumps(document, indent=2, default=str) + "\n")


def append_jsonl(path: Path, document: Dict[str, Any]) -> None:
    """Append one JSON object as a line and fsync it before returning."""
    line = json.dumps(document, default=str, separators=(",", ":")) + "\n"
    with open(path, "ab") as handle:
        # A crash mid-append can leave a partial line: start ours on a fresh one.
        if handle.tell() > 0:
            with open(path, "rb") as reader:
                reader.seek(-1, os.SEEK_END)
                if reader.read(1) != b"\n":
                    line = "\n" + line
        handle.write(line.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """Every well-formed object in ``path``; damaged lines are skipped with a warning."""
    if not path.exists():
        return []
    documents = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                documents.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s line %d is damaged (interrupted write?); skipped", path, number)
    return documents


class ExperimentStore:
    """Read and write one experiment folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    @property
    def results_path(self) -> Path:
        return self.root / RESULTS

    @property
    def summary_path(self) -> Path:
        return self.root / SUMMARY

    def cell_dir(self, cell_id: str) -> Path:
        return self.root / CELLS / cell_id

    def exists(self) -> bool:
        return self.results_path.exists() or self.manifest_path.exists()

    def manifest(self) -> Dict[str, Any]:
        if not self.manifest_path.exists():
            return {}
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def write_manifest(self, manifest: Dict[str, Any]) -> None:
        atomic_write_json(self.manifest_path, manifest)

    def append(self, record: ResultBase) -> None:
        append_jsonl(self.results_path, record.model_dump(mode="json"))

    def records(self) -> List[ResultBase]:
        return [parse_record(doc) for doc in read_jsonl(self.results_path)]

    @property
    def lock_path(self) -> Path:
        return self.root / ".lock"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder exclusively, so two sweeps never interleave their results."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                handle.seek(0)
                owner = handle.read().strip() or "another process"
                raise TorchscaleError(
                    f"{self.root} is in use by torchscale ({owner}); wait for it to finish "
                    "or choose another --output-dir"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}")
            handle.flush()
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def find_experiments(source: Path) -> List[Path]:
    """Experiment folders under ``source``: itself, or its children that hold results."""
    source = Path(source)
    if (source / RESULTS).exists() or (source / MANIFEST).exists():
        return [source]
    if not source.is_dir():
        return []
    return sorted(
        child
        for child in source.iterdir()
        if child.is_dir() and ((child / RESULTS).exists() or (child / MANIFEST).exists())
    )


def check_writable(directory: Path) -> None:
    """Fail before any work when results could not be written under ``directory``.

    Probes by writing (``os.access`` says yes to root even on read-only mounts).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise TorchscaleError(
            f"output dir {directory} is not writable ({reason}); choose another --output-dir"
        ) from None
