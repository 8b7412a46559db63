"""After a profiled cell: make every rank's trace readable (nsys -> SQLite) and analyse them."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any, Dict

from torchscale.launch.nsys import export_sqlite

log = logging.getLogger("torchscale")


def analyze_traces(profile_dir: Path) -> Dict[str, Any]:
    """Export nsys reports if any; returns fields for the record's ``profile`` block."""
    info: Dict[str, Any] = {}
    if any(profile_dir.glob("rank*.nsys-rep")):
        try:
            export_sqlite(profile_dir)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("nsys export failed in %s: %s", profile_dir, exc)
            info["reason"] = f"traced, but nsys export failed: {exc}"
    return info
