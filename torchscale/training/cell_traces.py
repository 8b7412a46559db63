"""After a profiled cell: make every rank's trace readable (nsys -> SQLite) and analyse them
(the training kind's ``analyze_traces``, which the launcher calls).

The analysis (``torchscale.profiling``) writes ``findings.json`` and the per-rank tables beside
the traces, where ``report`` and ``profile`` read them.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Dict

from torchscale.errors import TorchscaleError
from torchscale.launch.nsys import export_sqlite
from torchscale.results.layout import FINDINGS_FILE, NSYS_REPORT_GLOB

log = logging.getLogger("torchscale")


def analyze_traces(profile_dir: Path, target: str) -> Dict[str, object]:
    """Export nsys reports if any, analyse; returns fields for the record's ``profile`` block."""
    from torchscale.profiling.analysis import analyze
    from torchscale.profiling.outputs import write_outputs

    if any(profile_dir.glob(NSYS_REPORT_GLOB)):
        try:
            export_sqlite(profile_dir)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("nsys export failed in %s: %s", profile_dir, exc)
            return {"reason": f"traced, but nsys export failed: {exc}"}
    try:
        result = analyze([profile_dir], target)
        write_outputs(result, profile_dir)
    except (TorchscaleError, OSError, ValueError) as exc:
        log.warning("trace analysis failed in %s: %s", profile_dir, exc)
        return {"reason": f"traced, but the analysis failed: {exc}"}
    return {"findings": len(result.findings), "findings_file": FINDINGS_FILE}
