"""The experiment folder on disk: written so that results are never lost or corrupted.

Layout of ``<output-dir>/<experiment_name>/`` (every name: :mod:`torchscale.results.layout`)::

    manifest.json        resolved config, versions, host, GPUs (rewritten atomically)
    results.jsonl        one record per finished cell, appended and fsynced: the source of truth
    summary.csv          a flat table derived from results.jsonl (rewritten atomically)
    cells/<cell_id>/     cell.json, result.json, torchrun and per-rank logs, error files, traces;
                         owner.json while a launch runs the cell
    .lock                held (flock) while a benchmark writes here
    .reserve             space set aside during a sweep, so that a full disk cannot keep the
                         cell it killed from being recorded

Every file here is written through :mod:`torchscale.results.files` (its atomic writes and its
append): never through a symbolic link, never into a FIFO or a device. A crash can at worst leave
a partial last line in ``results.jsonl``; readers skip it with a warning and the next append
starts on a fresh line (an append that fails, on a full disk say, is cut back to where it
started).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from torchscale.errors import TorchscaleError
from torchscale.results.files import (
    StorageError,
    append_jsonl,
    atomic_write_json,
    ensure_dir,
    not_regular,
    open_for_write,
    refuse_link,
    storage_cause,
)
from torchscale.results.json_input import json_kind, jsonl_documents, read_object
from torchscale.results.layout import CELLS, LOCK, MANIFEST, RESERVE, RESULTS, SUMMARY, cell_dir
from torchscale.results.schema import ResultBase

log = logging.getLogger("torchscale")

RESERVE_BYTES = 1 << 20
"""Set aside while a sweep runs and given back when the disk fills, to record the dying cell."""


def read_jsonl(path: Path, offset: int = 0) -> List[Dict[str, object]]:
    """Every object in ``path`` (from byte ``offset`` on); damaged lines (and lines that are not
    objects) are skipped with a warning naming them
    (:func:`~torchscale.results.json_input.jsonl_documents`)."""
    if not path.exists():
        return []
    documents = []
    for number, document in jsonl_documents(path, offset=offset):
        if isinstance(document, dict):
            documents.append(document)
        else:
            kind = json_kind(document)
            log.warning("%s line %d is damaged (%s, not an object); skipped", path, number, kind)
    return documents


class FolderLostError(TorchscaleError):
    """The experiment folder went away (or was replaced) while this torchscale held it."""


class ExperimentStore:
    """Read and write one experiment folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._owned: Optional[Tuple[Tuple[int, int], Tuple[int, int]]] = None  # folder, lock

    def check_owned(self) -> None:
        """While :meth:`lock` holds the folder, before every write: it is still the folder that
        was locked, and its lock file still the one held. A folder deleted (or moved away, or
        replaced) mid-sweep must stop the sweep, not be silently re-created with part of the
        results (:class:`FolderLostError`)."""
        if self._owned is None:
            return
        folder, lock = self._owned
        try:
            now = os.stat(self.root)
        except FileNotFoundError:
            raise self._lost("was deleted") from None
        except OSError as exc:
            raise storage_error(self.root, exc) from None
        if (now.st_dev, now.st_ino) != folder:
            raise self._lost("was replaced by another folder")
        try:
            held = os.lstat(self.lock_path)
        except OSError:
            held = None
        if held is None or (held.st_dev, held.st_ino) != lock:
            raise self._lost(f"lost its lock ({LOCK} was removed or replaced)")

    def _lost(self, what: str) -> FolderLostError:
        return FolderLostError(
            f"the results folder {self.root} {what} while this torchscale was writing to it; "
            "nothing more is written there"
        )

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
        return cell_dir(self.root, cell_id)

    def make_cell_dir(self, cell_id: str) -> Path:
        """The cell's folder, created; no folder on the way (``cells``, the cell's) may be a
        symbolic link."""
        self.check_owned()
        path = self.cell_dir(cell_id)
        self.root.mkdir(parents=True, exist_ok=True)  # the experiment folder may be a link
        for part in reversed([path, *path.parents]):
            if self.root in part.parents:
                ensure_dir(part)
        return path

    def exists(self) -> bool:
        return self.results_path.exists() or self.manifest_path.exists()

    def manifest(self) -> Dict[str, Any]:
        """The manifest, its top-level fields of the wrong type left out with a warning; a
        manifest that is not a JSON object is :class:`DamagedJson` (one line, exit 2)."""
        if not self.manifest_path.exists():
            return {}
        return checked_manifest(read_object(self.manifest_path, "manifest"), self.manifest_path)

    def write_manifest(self, manifest: Dict[str, object]) -> None:
        self.check_owned()
        atomic_write_json(self.manifest_path, manifest)

    def append(self, record: ResultBase) -> None:
        self.check_owned()
        append_jsonl(self.results_path, record.model_dump(mode="json"))

    def results_size(self) -> int:
        try:
            return os.stat(self.results_path).st_size
        except FileNotFoundError:
            return 0

    def records_from(self, offset: int) -> List[ResultBase]:
        """The records of ``results.jsonl`` from byte ``offset`` on (what was just appended),
        checked as :meth:`records` checks them."""
        from torchscale.results.validity import check_and_parse

        return check_and_parse(read_jsonl(self.results_path, offset), self.results_path)[1]

    def records(self) -> List[ResultBase]:
        """The records, checked (see :mod:`torchscale.results.validity`)."""
        from torchscale.results.validity import check_and_parse

        return check_and_parse(read_jsonl(self.results_path), self.results_path)[1]

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK

    @property
    def reserve_path(self) -> Path:
        return self.root / RESERVE

    def check_links(self) -> None:
        """Refuse, before anything runs, a results folder whose files are links (or FIFOs)."""
        for path in (self.lock_path, self.results_path, self.summary_path, self.manifest_path):
            refuse_link(path)
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                raise not_regular(path, mode, "write")
        refuse_link(self.root / CELLS)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder exclusively, so two sweeps never interleave their results.

        The lock is ``flock`` on ``.lock``, opened as a regular file without following links.
        A full or read-only folder is one line (:class:`StorageError`), not a traceback.
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.check_links()
            fd = open_for_write(self.lock_path, read=True)
        except OSError as exc:
            raise storage_error(self.root, exc) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                raise TorchscaleError(
                    f"{self.root} is in use by torchscale ({owner or 'another process'}); wait "
                    "for it to finish or choose another --output-dir"
                ) from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
                folder, lock = os.stat(self.root), os.fstat(fd)
            except OSError as exc:
                raise storage_error(self.root, exc) from None
            self._owned = ((folder.st_dev, folder.st_ino), (lock.st_dev, lock.st_ino))
            try:
                yield
            finally:
                self._owned = None
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def hold_reserve(self) -> None:
        """Set ``RESERVE_BYTES`` aside (a full disk now is found before any cell runs)."""
        try:
            fd = open_for_write(self.reserve_path)
            try:
                size = os.fstat(fd).st_size
                if size < RESERVE_BYTES:
                    try:
                        os.posix_fallocate(fd, 0, RESERVE_BYTES)
                    except OSError as exc:
                        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                            raise
                        os.pwrite(fd, b"\0" * (RESERVE_BYTES - size), size)
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(self.reserve_path)
            raise storage_error(self.root, exc) from None

    @contextlib.contextmanager
    def reserved(self) -> Iterator[None]:
        """:meth:`hold_reserve` for the block; the space is given back after it, whatever
        happens."""
        self.hold_reserve()
        try:
            yield
        finally:
            self.release_reserve()

    def release_reserve(self) -> bool:
        """Give the reserved space back; whether there was any."""
        try:
            os.unlink(self.reserve_path)
            return True
        except (FileNotFoundError, IsADirectoryError):
            return False


MANIFEST_FIELDS: Dict[str, Tuple[type, ...]] = {
    "schema_version": (int,),
    "experiment": (str,),
    "torchscale": (str,),
    "created_at": (str,),
    "updated_at": (str,),
    "runs": (list,),
    "config": (dict,),
    "swept": (list,),
    "cells": (list,),
    "environment": (dict,),
    "launch": (dict,),
    "nodes": (list,),
}
"""The manifest's fields and their JSON types (what its readers rely on)."""
_MANIFEST_ITEMS = {
    "runs": (dict, "an object"),
    "swept": (str, "a string"),
    "cells": (str, "a string"),
    "nodes": (dict, "an object"),
}


def checked_manifest(manifest: Dict[str, Any], source: Path) -> Dict[str, Any]:
    """``manifest`` without the fields whose type is wrong (each named in one warning)."""
    wrong = []
    kept: Dict[str, Any] = {}
    for key, value in manifest.items():
        types = MANIFEST_FIELDS.get(key)
        item = _MANIFEST_ITEMS.get(key)
        if types and value is None:
            continue  # as if absent: readers default it
        if types and (not isinstance(value, types) or isinstance(value, bool)):
            wrong.append(f"{key} is {json_kind(value)}")
        elif item and not all(isinstance(entry, item[0]) for entry in value):
            wrong.append(f"{key} holds something that is not {item[1]}")
        else:
            kept[key] = value
    if wrong:
        log.warning("%s is damaged (%s); left out", source, "; ".join(wrong))
    return kept


def storage_error(folder: Path, exc: OSError, *, exit_code: int = 2, detail: str = "") -> Any:
    """``exc`` as the one line the user sees: a :class:`StorageError` when the disk is full,
    read-only, over quota or not permitted; other errors are returned as they are."""
    cause = storage_cause(exc)
    if cause is None:
        return exc
    return StorageError(folder, cause, exit_code=exit_code, detail=detail)


def storage_problem(folder: Path) -> Optional[str]:
    """Why nothing can be written in ``folder`` now (a full disk, a read-only mount), or None.

    Asked after a cell failed without saying why: workers that cannot write their files cannot
    say it themselves.
    """
    try:
        vfs = os.statvfs(folder)
    except OSError as exc:
        return storage_cause(exc)
    if vfs.f_flag & getattr(os, "ST_RDONLY", 1):
        return storage_cause(OSError(errno.EROFS, "read-only"))
    free = vfs.f_bfree if os.geteuid() == 0 else vfs.f_bavail
    if free * vfs.f_frsize < 64 * 1024 or (vfs.f_files and vfs.f_ffree == 0):
        return storage_cause(OSError(errno.ENOSPC, "full"))
    probe = folder / f".probe.{secrets.token_hex(4)}"
    try:
        fd = open_for_write(probe, exclusive=True)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return storage_cause(exc)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


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


def check_writable(directory: Path, option: str = "--output-dir") -> None:
    """Fail before any work when results could not be written under ``directory`` (``option``
    names it in the message).

    Probes by writing (``os.access`` says yes to root even on read-only mounts).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        cause = storage_cause(exc) or exc.strerror or str(exc)
        raise TorchscaleError(
            f"{option} {directory} is not writable ({cause}); choose another {option}"
        ) from None
