"""The ``report`` use case: one call from a results folder to a written report file."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from torchscale.errors import TorchscaleError
from torchscale.report.render import FORMATS, render
from torchscale.report.report_data import ReportData, load_report_data
from torchscale.results.layout import TENSORBOARD_DIR, charts_dir, report_file
from torchscale.results.store import atomic_write_bytes

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


def default_output(data: ReportData, fmt: str) -> Path:
    """``<source>/<experiment>-report.<fmt>`` (the source folder's name for several)."""
    name = data.title if len(data.experiments) == 1 else data.source.resolve().name
    return data.source / report_file(name, fmt)


def check_output(path: Path) -> None:
    """Fail before any work when the report could not be written to ``path``."""
    if path.is_dir():
        raise TorchscaleError(f"--output {path} is a folder; give a file name such as report.html")
    folder = path.parent
    if not folder.is_dir():
        raise TorchscaleError(
            f"--output folder {folder} does not exist; create it or choose another --output"
        )
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TorchscaleError(
            f"cannot write the report to {folder} ({exc.strerror or exc}); choose another --output"
        ) from None


def generate_report(request: ReportRequest) -> Path:
    """Render the report and write it atomically; returns its path."""
    fmt = request.fmt.lower()
    if fmt not in (*FORMATS, *EXPORT_FORMATS):
        raise TorchscaleError(
            f"unknown report format '{request.fmt}': use --format "
            + ", ".join((*FORMATS, *EXPORT_FORMATS))
        )
    data = load_report_data(request.source)
    if fmt == "tensorboard":
        from torchscale.integrations.tensorboard_events import export_tensorboard

        return export_tensorboard(data, request.output or data.source / TENSORBOARD_DIR)
    if fmt == "png":
        from torchscale.report.png_charts import require_matplotlib, write_png_charts

        require_matplotlib()
        name = data.title if len(data.experiments) == 1 else data.source.resolve().name
        folder = request.output or data.source / charts_dir(name)
        from torchscale.report.content import build_content

        write_png_charts(build_content(data, None), folder)
        return folder
    output = request.output or default_output(data, fmt)
    check_output(output)
    if fmt == "json":
        from torchscale.report.document import render_documents

        atomic_write_bytes(output, render_documents(data))
        return output
    comparison = None
    if request.baseline is not None:
        from torchscale.analysis.comparison import CompareOptions, compare_runs

        baseline = load_report_data(request.baseline, "--baseline")
        result = compare_runs(
            baseline.records, data.records, CompareOptions(threshold_pct=request.threshold_pct)
        )
        comparison = (result, request.threshold_pct, str(request.baseline))

    from torchscale.report.content import build_content

    atomic_write_bytes(output, render(build_content(data, comparison), fmt))
    return output
