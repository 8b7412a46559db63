"""What a validate report (the JSON document) shows on the console besides its checks table
(``cli/validate_command.py`` lays that out through the shared console renderer): the GPU topology
matrix, the summary line, and the fixes several checks share, said once."""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional

from rich.table import Table
from rich.text import Text

STYLES = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "SKIP": "dim"}


WIDE = 120
"""Below this many columns the fix is stacked under the value instead of a column of its own."""


def shared_fixes(report: Dict[str, Any]) -> Dict[str, int]:
    """Fixes that several checks share (on a CPU node every GPU check says the same), numbered:
    the table says each once, as a note under it."""
    counts = Counter(check["fix"] for check in report["checks"] if check["fix"])
    shared = [fix for fix, n in counts.items() if n > 1]
    return {fix: number for number, fix in enumerate(shared, 1)}


def fix_text(fix: Optional[str], notes: Dict[str, int]) -> str:
    """What a check's row says about its fix: the fix, or the note that holds it."""
    if not fix:
        return ""
    return f"see note {notes[fix]}" if fix in notes else fix


def note_lines(report: Dict[str, Any], notes: Dict[str, int]) -> List[str]:
    """One line per shared fix: ``note 1 (12 checks): <fix>``."""
    lines = []
    for fix, number in notes.items():
        count = sum(1 for c in report["checks"] if c["fix"] == fix)
        lines.append(f"note {number} ({count} checks): {fix}")
    return lines


def topology_table(report: Dict[str, Any]) -> Optional[Table]:
    """The GPU x GPU matrix, as ``nvidia-smi topo -m`` shows it; None with fewer than 2 GPUs."""
    topology = next((c for c in report["checks"] if c["name"] == "GPU topology"), None)
    matrix: List[List[str]] = (topology or {}).get("details", {}).get("matrix", [])
    if len(matrix) < 2:
        return None
    table = Table(title="GPU topology (as nvidia-smi topo -m)", title_justify="left")
    table.add_column("")
    for i in range(len(matrix)):
        table.add_column(f"GPU{i}", justify="center")
    for i, row in enumerate(matrix):
        table.add_row(f"GPU{i}", *row)
    return table


def summary_line(report: Dict[str, Any]) -> Text:
    s = report["summary"]
    counts = f"{s['pass']} PASS, {s['warn']} WARN, {s['fail']} FAIL, {s['skip']} SKIP"
    if not s["ok"]:
        verdict, style = "not ready: fix the FAIL rows first", "bold red"
    elif report["backend"] == "gloo":
        verdict, style = "ready for CPU (gloo) benchmarking only", "bold yellow"
    else:
        verdict, style = "ready for DDP with NCCL", "bold green"
    return Text.assemble(f"{counts} in {report['duration_s']:.1f} s: ", (verdict, style))
