"""The ``report`` use case: one call from a results folder to a written report file."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from torchscale.analysis.report_data import ReportData, load_report_data
from torchscale.errors import TorchscaleError
from torchscale.report.render import FORMATS, render
from torchscale.results.files import atomic_write_bytes, check_output_file
from torchscale.results.layout import (
    CELLS,
    EXPERIMENT_FILES,
    FINDINGS_FILE,
    TENSORBOARD_DIR,
    charts_dir,
    report_file,
)

if TYPE_CHECKING:
    from torchscale.analysis.comparison import Comparison
    from torchscale.report.content import ReportContent

EXPORT_FORMATS = ("json", "tensorboard", "png")
"""Formats that export the results for other tools (the seed's JSON document, TensorBoard) or as
files of their own (PNG charts: a folder)."""


@dataclass(frozen=True)
class ReportRequest:
    source: Path
    fmt: str = "html"
    output: Optional[Path] = None
    baseline: Optional[Path] = None
    threshold_pct: float = 5.0
    noise_floor_pct: Optional[float] = None  # with a baseline: as ``compare --noise-floor``
    history: Optional[str] = None  # --history (else TORCHSCALE_HISTORY): past predictions' error


@dataclass(frozen=True)
class WrittenReport:
    path: Path  # the report file, or the folder of TensorBoard runs or PNG charts
    files: Tuple[Path, ...] = ()  # PNG charts: each file written, in order (a kind may have more)


def default_output(data: ReportData, fmt: str) -> Path:
    """``<source>/<experiment>-report.<fmt>`` (the source folder's name for several)."""
    name = data.title if len(data.experiments) == 1 else data.source.resolve().name
    return data.source / report_file(name, fmt)


def report_inputs(data: ReportData) -> List[Path]:
    """What the report reads: each experiment's files (:data:`EXPERIMENT_FILES`) and findings."""
    found = []
    for experiment in data.experiments:
        found += [experiment.path / name for name in EXPERIMENT_FILES]
        found += sorted(experiment.path.rglob(FINDINGS_FILE))
    return found


def check_output(path: Path, inputs: Sequence[Path] = (), cells: Sequence[Path] = ()) -> None:
    """Fail before any work when the report could not be written to ``path``, or would replace
    one of its ``inputs`` or land among an experiment's cell files (``cells``)."""
    check_output_file(path, inputs)
    folder = path.parent.resolve()
    for cell_files in cells:
        if cell_files.resolve() in (folder, *folder.parents):
            raise TorchscaleError(
                f"--output {path} is inside {cell_files}, which holds the run's cell files; "
                "choose another --output"
            )
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TorchscaleError(
            f"cannot write the report to {folder} ({exc.strerror or exc}); choose another --output"
        ) from None


def _tensorboard(data: ReportData, root: Path) -> Path:
    """Event files under ``root``; a folder that cannot be written is one line, not a trace."""
    from torchscale.integrations.tensorboard_events import export_tensorboard, require_tensorboard
    from torchscale.results.files import storage_cause
    from torchscale.results.store import check_writable

    require_tensorboard()
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise TorchscaleError(f"--output {root} is not a folder; TensorBoard output is a folder")
    check_writable(root, "--output")
    try:
        return export_tensorboard(data, root)
    except OSError as exc:
        cause = storage_cause(exc) or exc.strerror or str(exc)
        raise TorchscaleError(
            f"cannot write TensorBoard runs under {root} ({cause}); choose another --output"
        ) from None


def report_content(
    data: ReportData, comparison: Optional[Tuple[Comparison, float, str]] = None
) -> ReportContent:
    """The report of ``data``: every table computed once (analysis), then drawn (report);
    ``comparison`` is (result, threshold %, baseline)."""
    from torchscale.analysis.report_tables import report_tables
    from torchscale.report.content import build_content

    return build_content(report_tables(data, comparison))


def _png_charts(data: ReportData, output: Optional[Path]) -> WrittenReport:
    """``--format png``: the report's key charts as PNG files in a folder (the Distributed
    Training Profiler's ``latency_histogram.png`` among them)."""
    from torchscale.report.png_charts import require_matplotlib, write_png_charts
    from torchscale.results.store import check_writable

    require_matplotlib()
    name = data.title if len(data.experiments) == 1 else data.source.resolve().name
    folder = output or data.source / charts_dir(name)
    if folder.exists() and not folder.is_dir():
        raise TorchscaleError(f"--output {folder} is not a folder; PNG charts go in a folder")
    check_writable(folder, "--output")
    return WrittenReport(folder, tuple(write_png_charts(report_content(data), folder)))


def generate_report(request: ReportRequest) -> Path:
    """Render the report and write it atomically; returns its path."""
    return write_report(request).path


def write_report(request: ReportRequest) -> WrittenReport:
    """Render the report and write it atomically; returns its path (and PNG charts' files)."""
    fmt = request.fmt.lower()
    if fmt not in (*FORMATS, *EXPORT_FORMATS):
        raise TorchscaleError(
            f"unknown report format '{request.fmt}': use --format "
            + ", ".join((*FORMATS, *EXPORT_FORMATS))
        )
    data = load_report_data(request.source)
    from torchscale.app.history import past_prediction_error

    names = [e.name for e in data.experiments]
    data.past_prediction_error = past_prediction_error(names, request.history)
    if fmt == "tensorboard":
        return WrittenReport(_tensorboard(data, request.output or data.source / TENSORBOARD_DIR))
    if fmt == "png":
        return _png_charts(data, request.output)
    output = request.output or default_output(data, fmt)
    inputs = report_inputs(data)
    cells = [experiment.path / CELLS for experiment in data.experiments]
    baseline_data = None
    if request.baseline is not None:
        baseline_data = load_report_data(request.baseline, "--baseline")
        inputs += report_inputs(baseline_data)
        cells += [experiment.path / CELLS for experiment in baseline_data.experiments]
    check_output(output, inputs, cells)
    if fmt == "json":
        from torchscale.analysis.report_tables import experiments_tables
        from torchscale.report.document import render_documents

        atomic_write_bytes(output, render_documents(experiments_tables(data)))
        return WrittenReport(output)
    comparison = None
    if baseline_data is not None:
        from torchscale.analysis.comparison import CompareOptions, compare_runs

        # The same verdicts as ``torchscale compare``: one function, the same options.
        options = CompareOptions(
            threshold_pct=request.threshold_pct, noise_floor_pct=request.noise_floor_pct
        ).checked()
        result = compare_runs(baseline_data.records, data.records, options)
        comparison = (result, request.threshold_pct, str(request.baseline))

    atomic_write_bytes(output, render(report_content(data, comparison), fmt))
    return WrittenReport(output)
