"""The report's key charts as PNG files (``torchscale report --format png``), drawn with
Matplotlib from the same chart specs as the HTML (Plotly) and PDF (SVG) reports: the Distributed
Training Profiler's ``latency_histogram.png`` and its siblings.

One file per kind of chart (``results.layout.PNG_CHARTS``), one panel per chart of that kind (per
model, configuration or op), so a sweep's configurations stay side by side; past
:data:`PANELS_PER_FILE` panels a kind continues in ``<name>_2.png``, ``<name>_3.png``... so that no
chart is left out. Matplotlib is an optional extra (``pip install 'torchscale[png]'``); nothing
imports it until a PNG is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from torchscale.errors import TorchscaleError
from torchscale.report.elements import REFERENCE_COLOR, Chart, Series, Stacks
from torchscale.results.files import atomic_write_bytes
from torchscale.results.layout import PNG_CHARTS, png_chart_file

if TYPE_CHECKING:
    from torchscale.report.content import ReportContent

INSTALL_HINT = "pip install 'torchscale[png]'"
PANELS_PER_FILE = 8
"""Panels per file; a kind with more continues in further files (one figure of every panel would
pass Matplotlib's 2^16-pixel limit at a few dozen configurations, and no viewer shows it whole)."""
PANEL_INCHES = (9.0, 4.2)
DPI = 110


def require_matplotlib() -> None:
    """Fail in one line, before any work, when Matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TorchscaleError(f"PNG charts need Matplotlib: {INSTALL_HINT}") from None


def _text(value: object) -> str:
    """Text as written: Matplotlib reads ``$...$`` as math, a name from a config is not."""
    return str(value).replace("$", r"\$")


def _number(value: Any) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number else math.nan


def _positions(chart: Chart, series: Series) -> List[float]:
    if chart.x_type == "category":
        index = {label: i for i, label in enumerate(chart.categories())}
        return [float(index[str(x)]) for x in series.x]
    return [_number(x) for x in series.x]


def _bars(ax: Any, chart: Chart, bars: List[Series], colors: Dict[str, str]) -> None:
    width = 0.8 if chart.barmode != "group" else 0.8 / max(1, len(bars))
    stacks = Stacks()  # positive parts up from zero, negative ones down, as in the HTML and PDF
    for i, series in enumerate(bars):
        x = _positions(chart, series)
        y = [_number(v) for v in series.y]
        if chart.barmode == "group":
            x = [p - 0.4 + width * (i + 0.5) for p in x]
        heights = [0.0 if math.isnan(v) else v for v in y]
        stack = chart.barmode == "stack"
        bottom = [stacks.place(p, v) if stack else 0.0 for p, v in zip(x, heights)]
        errors = None
        if series.low is not None and series.high is not None:
            errors = [
                [max(0.0, v - _number(lo)) if not math.isnan(_number(lo)) else 0.0
                 for v, lo in zip(y, series.low)],
                [max(0.0, _number(hi) - v) if not math.isnan(_number(hi)) else 0.0
                 for v, hi in zip(y, series.high)],
            ]  # fmt: skip
        ax.bar(x, heights, width=width, bottom=bottom,
               color=colors.get(series.color_key or series.name), label=_text(series.name),
               yerr=errors, capsize=3 if errors else 0)  # fmt: skip


def _series(ax: Any, chart: Chart, colors: Dict[str, str]) -> None:
    _bars(ax, chart, [s for s in chart.series if s.kind == "bar"], colors)
    for series in chart.series:
        color = (
            REFERENCE_COLOR
            if series.color_key == "__ideal"
            else colors.get(series.color_key or series.name)
        )
        label: Optional[str] = _text(series.name) if series.show_legend else None
        x = _positions(chart, series)
        if series.kind == "box":
            samples = [[_number(v) for v in values] for values in series.y]
            ax.boxplot(samples, positions=x, widths=0.5, showfliers=True)
        elif series.kind == "marker":
            ax.scatter(x, [_number(v) for v in series.y], color=color, label=label, zorder=3)
        elif series.kind == "line":
            ax.plot(x, [_number(v) for v in series.y], color=color, label=label, marker="o",
                    linestyle="--" if series.dashed else "-", markersize=3)  # fmt: skip


def _axes(ax: Any, chart: Chart) -> None:
    for band in chart.bands:
        ax.axhspan(band.low, band.high, color=band.color[0], alpha=band.color[1],
                   label=_text(band.label))  # fmt: skip
    for y, text in chart.hlines:
        ax.axhline(y, color=REFERENCE_COLOR, linestyle=":", label=_text(text))
    if chart.x_type == "log":
        ax.set_xscale("log", base=2)
    if chart.x_type == "category":
        labels = [_text(label) for label in chart.categories()]
        ax.set_xticks(range(len(labels)))
        slanted = chart.long_categories()
        ax.set_xticklabels(
            labels, rotation=30 if slanted else 0, ha="right" if slanted else "center", fontsize=8
        )
    elif chart.x_ticks:
        ax.set_xticks(chart.x_ticks)
        ax.set_xticklabels([str(t) for t in chart.x_ticks])
    if chart.y_range is not None:
        ax.set_ylim(*chart.y_range)
    elif chart.y_from_zero:
        ax.set_ylim(bottom=0)
    ax.set_title(_text(chart.title), fontsize=10, loc="left")
    ax.set_xlabel(_text(chart.x_title))
    ax.set_ylabel(_text(chart.y_title))
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=7, loc="best")


def draw_figure(charts: List[Chart]) -> Any:
    """A Matplotlib ``Figure`` holding ``charts``, one panel each, stacked."""
    require_matplotlib()
    from matplotlib.figure import Figure

    width, height = PANEL_INCHES
    figure = Figure(figsize=(width, height * len(charts)), dpi=DPI, layout="constrained")
    axes = figure.subplots(len(charts), 1, squeeze=False)[:, 0]
    for ax, chart in zip(axes, charts):
        _series(ax, chart, chart.colors())
        _axes(ax, chart)
    return figure


def draw_png(charts: List[Chart]) -> bytes:
    """One PNG holding ``charts``, one panel each, stacked."""
    import io

    buffer = io.BytesIO()
    draw_figure(charts).savefig(buffer, format="png")
    return buffer.getvalue()


def _kind(chart_id: str) -> Optional[str]:
    """The PNG file a chart belongs in: the longest kind its id starts with."""
    found = [kind for kind in PNG_CHARTS if chart_id == kind or chart_id.startswith(kind + "-")]
    return max(found, key=len) if found else None


def write_png_charts(content: ReportContent, folder: Path) -> List[Path]:
    """The key charts of ``content`` as PNG files in ``folder`` (created), every chart in one:
    :data:`PANELS_PER_FILE` to a file, in the report's order. Returns the paths written."""
    require_matplotlib()
    if folder.exists() and not folder.is_dir():
        raise TorchscaleError(f"--output {folder} is a file; PNG charts go to a folder")
    by_kind: Dict[str, List[Chart]] = {}
    for chart in content.charts:
        kind = _kind(chart.chart_id)
        if kind is not None and chart.has_data():
            by_kind.setdefault(kind, []).append(chart)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, charts in by_kind.items():
        for part, start in enumerate(range(0, len(charts), PANELS_PER_FILE), start=1):
            path = folder / png_chart_file(kind, part)
            atomic_write_bytes(path, draw_png(charts[start : start + PANELS_PER_FILE]))
            written.append(path)
    return written
