"""Opening and writing files safely in a folder that other people (and other programs) can touch.

The one path for every file torchscale writes: :func:`atomic_write_bytes` (and its text and JSON
forms) owns the whole trip of a replaced file: the no-link and regular-file checks, the temporary
file, write, fsync, rename and the folder's fsync. :func:`append_jsonl` appends a line, fsynced,
never leaving a partial one; :func:`ensure_dir` makes a folder that is not a link.

One helper opens every file torchscale writes in a results folder: :func:`open_for_write`. It
never follows a symbolic link (``O_NOFOLLOW``), never blocks on a FIFO (``O_NONBLOCK`` until the
file is known to be regular) and refuses anything that is not a regular file, with one line
(:class:`UnsafePathError`, exit 2). :func:`open_for_read` is its reading twin for inputs that are
read whole or streamed (results, configs, traces): a FIFO or a device is refused instead of
hanging or reading forever.

A full disk, a read-only mount, a quota, a file-size limit or a permission problem becomes
:class:`StorageError`:
one line naming the folder and the cause (:func:`storage_cause` tells those errors apart from
the rest). :func:`dumps` is the one JSON encoder for what torchscale writes or prints: strict
JSON, a non-finite number becomes ``null``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from torchscale.errors import TorchscaleError

PathLike = Union[str, "os.PathLike[str]"]


class UnsafePathError(TorchscaleError):
    """A path torchscale will not write (or read) through: a link, a FIFO, a device."""


STORAGE_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "file too large for the file-size limit (ulimit -f?)",
}


def storage_cause(exc: BaseException) -> Optional[str]:
    """``no space left on device`` (...) when ``exc`` is a storage error, else None."""
    if isinstance(exc, OSError) and exc.errno in STORAGE_CAUSES:
        return f"{STORAGE_CAUSES[exc.errno]} ({errno.errorcode[exc.errno]})"
    return None


class StorageError(TorchscaleError):
    """The results folder cannot be written: full, read-only, over quota, not permitted.

    Exit 2 when it is found before any cell ran, 1 when a sweep was under way (what finished is
    intact, ``--resume`` goes on once the cause is fixed).
    """

    def __init__(self, folder: PathLike, cause: str, *, detail: str = "", exit_code: int = 2):
        self.folder = Path(folder)
        self.cause = cause
        self.exit_code = exit_code
        text = f"cannot write to {self.folder}: {cause}"
        super().__init__(f"{text}; {detail}" if detail else text)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: PathLike, mode: int, verb: str = "read") -> UnsafePathError:
    return UnsafePathError(
        f"{path} is {_kind(mode)}, not a regular file; torchscale does not {verb} it"
    )


def refuse_link(path: PathLike) -> None:
    """Raise :class:`UnsafePathError` when ``path`` exists as a symbolic link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise UnsafePathError(
            f"{path} is a symbolic link; torchscale does not write through links in a results "
            "folder: remove it (or choose another --output-dir)"
        )


def refuse_non_regular(path: PathLike, option: str = "the output") -> None:
    """Raise :class:`UnsafePathError` when ``path`` exists as anything but a regular file: a file
    written by replacing it must never replace a device, a FIFO, a socket or a link."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        raise UnsafePathError(
            f"{option} {path} is {_kind(mode)}, not a regular file; torchscale writes only "
            f"regular files: choose another {option}"
        )


def _same_file(path: Path, other: Path) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def check_output_file(
    path: PathLike, inputs: Iterable[PathLike] = (), option: str = "--output"
) -> None:
    """Refuse, before any work, an output file that would destroy something: one of the run's
    ``inputs`` (a report written over its own results.jsonl), anything that is not a regular
    file (``/dev/null``, a FIFO, a socket, a link, a folder), or a path whose folder is a file
    or missing. One line each (:class:`UnsafePathError`, exit 2)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise UnsafePathError(f"{option} {path} is a folder; give a file name such as report.html")
    refuse_non_regular(path, option)
    for source in inputs:
        if _same_file(path, Path(source)):
            named = f" ({source})" if str(source) != str(path) else ""
            raise UnsafePathError(
                f"{option} {path} is one of this run's inputs{named}: writing there would "
                f"replace it; choose another {option}"
            )
    folder = path.parent
    for parent in (folder, *folder.parents):
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise UnsafePathError(
                    f"{option} {path}: {parent} is a file, not a folder; choose another {option}"
                )
            break
    if not folder.is_dir():
        raise UnsafePathError(
            f"{option} folder {folder} does not exist; create it or choose another {option}"
        )


def _checked_regular(fd: int, path: PathLike, verb: str) -> int:
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode, verb)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_for_write(
    path: PathLike, *, append: bool = False, exclusive: bool = False, read: bool = False
) -> int:
    """Open (creating) ``path`` for writing and return the descriptor; never through a link.

    ``append``: writes go to the end. ``exclusive``: the file must not exist (temporary files).
    ``read``: opened read-write (the lock file). The file is never truncated here.
    """
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_NONBLOCK
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if append:
        flags |= os.O_APPEND
    if exclusive:
        flags |= os.O_EXCL
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(path)
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads: O_NONBLOCK makes it fail, not block
            raise not_regular(path, os.lstat(path).st_mode, "write") from None
        raise
    return _checked_regular(fd, path, "write")


def open_for_read(path: PathLike) -> int:
    """Open ``path`` for reading (links followed) and return the descriptor; a FIFO, a device or
    a folder is refused with one line instead of hanging or reading without end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    return _checked_regular(fd, path, "read")


def read_limited(path: PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file, refusing one larger than ``limit``."""
    fd = open_for_read(path)
    with os.fdopen(fd, "rb") as handle:
        # Read what fstat says is there (a read of limit + 1 would allocate the limit each time)
        # and go on only if the file grew meanwhile, never past the limit.
        data = handle.read(min(os.fstat(fd).st_size, limit) + 1)
        while len(data) <= limit:
            more = handle.read(min(1 << 20, limit + 1 - len(data)))
            if not more:
                break
            data += more
    if len(data) > limit:
        raise TorchscaleError(
            f"{path} is larger than {limit:,} bytes, too large for a {what}; check the path"
        )
    return data


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path, parents: bool = True) -> None:
    """Create folder ``path`` (and its parents, unless ``parents`` is False: a rank's folder
    inside a cell folder that must exist, never re-created once deleted); refuse it when it is a
    symbolic link."""
    refuse_link(path)
    path.mkdir(parents=parents, exist_ok=True)
    refuse_link(path)


def atomic_write_bytes(path: Path, data: bytes, make_parents: bool = True) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix.

    A symbolic link at ``path`` is refused (the rename would not follow it, but a link where a
    result belongs is not torchscale's to replace), and so is anything else that is not a regular
    file (as root, replacing ``/dev/null`` would succeed). ``make_parents=False``: the folder must
    exist (a worker's files in a results folder that may have been deleted under it).
    """
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    refuse_link(path)
    refuse_non_regular(path)  # os.replace would put a regular file where /dev/null was
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    fd = open_for_write(tmp, exclusive=True)
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


def atomic_write_text(path: Path, text: str, make_parents: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), make_parents)


def atomic_write_json(path: Path, document: Any, make_parents: bool = True) -> None:
    atomic_write_text(path, dumps(document, indent=2) + "\n", make_parents)


def append_jsonl(path: Path, document: Dict[str, object]) -> None:
    """Append one JSON object as a line and fsync it before returning.

    If the write fails (a full disk), the file is cut back to its old length: the lines before
    stay whole and no partial line is left.
    """
    line = dumps(document, separators=(",", ":")) + "\n"
    fd = open_for_write(path, append=True, read=True)
    try:
        size = os.fstat(fd).st_size
        # A crash mid-append can leave a partial line: start ours on a fresh one.
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        data = memoryview(line.encode("utf-8"))
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def finite(value: object) -> object:
    """``value`` with every non-finite float (NaN, +-Infinity) replaced by None, recursively;
    numpy scalars and arrays become plain Python values."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if type(value).__name__ == "NAType":  # pandas.NA
        return None
    item = getattr(value, "item", None)  # numpy scalar
    if callable(item) and type(value).__module__ == "numpy":
        tolist = getattr(value, "tolist", None)
        return finite(tolist() if callable(tolist) else item())
    return value


def dumps(document: object, **kwargs: Any) -> str:
    """Strict JSON: NaN and Infinity become null (``allow_nan=False`` proves none is left)."""
    kwargs.setdefault("default", str)
    return json.dumps(finite(document), allow_nan=False, **kwargs)
