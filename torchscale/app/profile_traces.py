"""The use cases of ``torchscale profile analyze`` (traces already captured -> tables, findings
and their files) and ``torchscale profile diff`` (two captures of one job -> what moved)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.profiling.trace_diff import TraceDiff


@dataclass(frozen=True)
class TraceAnalysis:
    document: Dict[str, Any]
    """The findings file's document: per-rank breakdown, sync stall, findings, warnings."""
    written: List[str]
    """The files written to ``out_dir``: the findings file and each trace table's CSV."""
    out_dir: Path


def analyze_traces(
    paths: List[Path], target: str, max_memory: Optional[str], output_dir: Optional[Path]
) -> TraceAnalysis:
    """Read per-rank traces (files or folders), analyse them for ``target`` within the memory
    budget (``4G``, ``512M``) and write the findings and tables to ``output_dir`` (default:
    beside the traces)."""
    from torchscale.profiling.analysis import analyze, to_document
    from torchscale.profiling.outputs import write_outputs
    from torchscale.profiling.traces.memory_budget import parse_memory

    budget = None if max_memory is None else parse_memory(max_memory)
    result = analyze(paths, target, max_memory=budget)
    log = logging.getLogger("torchscale")
    for trace in result.traces:
        log.debug("rank %d: %s trace %s", trace.rank, trace.source, trace.path)
    out_dir = output_dir or (paths[0] if paths[0].is_dir() else paths[0].parent)
    written = write_outputs(result, out_dir)
    return TraceAnalysis(to_document(result), list(written), out_dir)


@dataclass(frozen=True)
class CaptureDiff:
    diff: TraceDiff
    written: List[str]
    """The CSV tables written to the output folder (none without one)."""
    ops_file: str
    """The name of the ops table's CSV, which holds every kernel and op."""


def diff_captures(
    old: Path, new: Path, output_dir: Optional[Path], max_memory: Optional[str]
) -> CaptureDiff:
    """Compare two captures of one job rank by rank; with ``output_dir``, write the ops and
    steps tables there. Refused, one line: captures that share no rank."""
    from torchscale.profiling.trace_diff import diff_traces
    from torchscale.profiling.traces.memory_budget import parse_memory

    budget = None if max_memory is None else parse_memory(max_memory)
    result = diff_traces([old], [new], budget)
    if result.tables["steps"].empty:
        raise TorchscaleError(f"{old} and {new} share no rank; diff two captures of the same job")
    from torchscale.results.layout import PROFILE_DIFF_FILES

    written = _write_tables(result, output_dir) if output_dir is not None else []
    return CaptureDiff(result, written, PROFILE_DIFF_FILES["ops"])


def _write_tables(diff: TraceDiff, out_dir: Path) -> List[str]:
    from torchscale.escaping import csv_text
    from torchscale.results.files import atomic_write_bytes
    from torchscale.results.layout import PROFILE_DIFF_FILES
    from torchscale.results.store import check_writable

    check_writable(out_dir)
    # Kernel and op names come from the traces: a name a spreadsheet would run stays text.
    rendered = {
        name: csv_text(diff.tables[key], float_format="%.3f").encode()
        for key, name in PROFILE_DIFF_FILES.items()
    }
    for name, data in rendered.items():
        atomic_write_bytes(out_dir / name, data)
    return list(rendered)
