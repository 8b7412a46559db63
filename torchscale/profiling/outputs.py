"""Write the analysis beside the traces: ``findings.json`` and one CSV per table.

Every file is written to a temporary name in the same folder, flushed and fsynced, then renamed
over the final name, so a reader (``torchscale report``) sees either the old file or the new one.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Dict

from torchscale.escaping import csv_text
from torchscale.profiling.analysis import ProfileAnalysis, to_document
from torchscale.profiling.trace_tables import table_files
from torchscale.results.files import atomic_write_bytes, check_output_file, dumps
from torchscale.results.layout import FINDINGS_FILE
from torchscale.results.store import check_writable

SCHEMA = "torchscale.profile.findings/1"


def write_outputs(result: ProfileAnalysis, out_dir: Path) -> Dict[str, Path]:
    """Write findings.json and the tables into ``out_dir``; return what was written."""
    check_writable(out_dir)
    # Render everything first: nothing is written if anything fails to render.
    rendered: Dict[str, bytes] = {}
    files = table_files()
    for key, name in files.items():
        rendered[name] = csv_text(result.tables[key], float_format="%.3f").encode()
    document = {
        "schema": SCHEMA,
        "created_at": datetime.now(timezone.utc).isoformat(),
        **to_document(result),
        "tables": files,
    }
    rendered[FINDINGS_FILE] = (dumps(document, indent=2) + "\n").encode()
    inputs = [trace.path for trace in result.traces]
    for name in rendered:  # a trace named findings.json is read, never replaced
        check_output_file(out_dir / name, inputs, "--output-dir")
    written = {}
    for name, data in rendered.items():
        atomic_write_bytes(out_dir / name, data)
        written[name] = out_dir / name
    return written
