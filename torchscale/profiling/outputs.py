"""Write the analysis beside the traces: ``findings.json`` and one CSV per table.

Every file is written to a temporary name in the same folder, flushed and fsynced, then renamed
over the final name, so a reader (``torchscale report``) sees either the old file or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict

from torchscale.errors import TorchscaleError
from torchscale.profiling.analysis import ProfileAnalysis, to_document

FINDINGS_FILE = "findings.json"
TABLE_FILES = {
    "ranks": "profile_ranks.csv",
    "steps": "profile_steps.csv",
    "kernel_classes": "profile_kernel_classes.csv",
    "collectives": "profile_collectives.csv",
}
SCHEMA = "torchscale.profile.findings/1"


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_outputs(result: ProfileAnalysis, out_dir: Path) -> Dict[str, Path]:
    """Write findings.json and the tables into ``out_dir``; return what was written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise TorchscaleError(
            f"cannot write to {out_dir} ({exc.strerror}); pass --output-dir with a writable folder"
        ) from None
    # Render everything first: nothing is written if anything fails to render.
    rendered: Dict[str, bytes] = {}
    for key, name in TABLE_FILES.items():
        rendered[name] = result.tables[key].to_csv(index=False, float_format="%.3f").encode()
    document = {
        "schema": SCHEMA,
        "created_at": datetime.now(timezone.utc).isoformat(),
        **to_document(result),
        "tables": TABLE_FILES,
    }
    rendered[FINDINGS_FILE] = (json.dumps(document, indent=2, default=str) + "\n").encode()
    written = {}
    for name, data in rendered.items():
        atomic_write(out_dir / name, data)
        written[name] = out_dir / name
    return written
