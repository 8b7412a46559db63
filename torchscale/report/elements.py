"""What a report is made of, independent of HTML or PDF: charts as neutral specs, and tables.

A ``Chart`` says what to draw (series, axes, reference bands) and carries the DataFrame it was
drawn from; ``plotly_charts`` and ``svg_charts`` each draw it their way, so the HTML and the PDF
always show the same numbers.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.escaping import csv_text
from torchscale.measures.table_scalars import frame_records
from torchscale.report import formatting as fmt

# Okabe-Ito, colour-blind safe, in an order that keeps neighbours distinct.
PALETTE = [
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
    "#8C564B",
    "#7F7F7F",
]
REFERENCE_COLOR = "#6B7280"
BAND_EXCELLENT = ("#10B981", 0.14)  # (colour, opacity)
BAND_GOOD = ("#FACC15", 0.18)
BAND_NOISE = ("#6B7280", 0.16)  # run-to-run noise: grey, a figure under it is not a signal


@dataclass
class Card:
    label: str
    value: str
    detail: str
    tone: str = "neutral"  # good, warn, bad or neutral


@dataclass
class Series:
    """One trace. ``kind``: line, bar, box (``y`` holds one list of samples per ``x``) or marker."""

    name: str
    x: List[Any]
    y: List[Any]
    kind: str = "line"
    color_key: Optional[str] = None  # series sharing a key share a colour (actual and ideal)
    dashed: bool = False
    show_legend: bool = True
    # An interval per point (a 95% CI): its low and high ends, in y's units (None: none drawn).
    low: Optional[List[Any]] = None
    high: Optional[List[Any]] = None


@dataclass
class Band:
    """A horizontal band of the value axis, such as the "good" scaling range."""

    low: float
    high: float
    label: str
    color: Tuple[str, float]  # (hex colour, opacity)


@dataclass
class Chart:
    chart_id: str
    title: str
    x_title: str
    y_title: str
    series: List[Series]
    data: pd.DataFrame
    x_type: str = "linear"  # linear, log or category
    y_type: str = "linear"
    x_ticks: Optional[List[Any]] = None
    bands: List[Band] = field(default_factory=list)
    hlines: List[Tuple[float, str]] = field(default_factory=list)
    barmode: str = "group"  # group, stack, or overlay (one bar per category, series share it)
    y_range: Optional[Tuple[float, float]] = None
    y_from_zero: bool = True  # False for distributions, where the spread matters
    colors_by_key: Dict[str, str] = field(default_factory=dict)  # fixed colours (verdicts)

    def colors(self) -> Dict[str, str]:
        """The colour of each series' key, in order of first appearance (same in every renderer)."""
        keys: Dict[str, str] = {}
        for series in self.series:
            key = series.color_key or series.name
            if key not in keys and key != "__ideal":  # the ideal line is grey, not a colour slot
                keys[key] = self.colors_by_key.get(key) or PALETTE[len(keys) % len(PALETTE)]
        return keys

    def categories(self) -> List[str]:
        """The x categories in order of first appearance (``x_type == "category"``)."""
        return list(dict.fromkeys(str(x) for series in self.series for x in series.x))

    def long_categories(self, plot_px: float = 900.0, char_px: float = 7.0) -> bool:
        """Whether a category chart's labels are too long to sit side by side: they are then
        slanted, and nothing else (the legend) may sit under the axis."""
        labels = self.categories()
        if self.x_type != "category" or not labels:
            return False
        return max(len(label) for label in labels) * char_px > plot_px / len(labels)

    def has_data(self) -> bool:
        return any(_finite(value) for series in self.series for value in _flat(series.y))


class Stacks:
    """Where each part of a stacked bar sits, as Plotly's ``relative`` barmode draws it (the HTML's
    ``stack``): positive parts stack upward from zero and negative ones downward from it, in
    series order. So a negative part (a cause that gave efficiency back) never hides another,
    and a category spans (its negatives' sum, its positives' sum), not its net total."""

    def __init__(self) -> None:
        self._up: Dict[Any, float] = {}
        self._down: Dict[Any, float] = {}

    def place(self, x: Any, value: float) -> float:
        """The base of a part of ``value`` at category ``x``; the next part there goes on it."""
        side = self._up if value >= 0 else self._down
        base = side.get(x, 0.0)
        side[x] = base + value
        return base

    def extents(self) -> List[float]:
        """The stacks' ends: every value the axis must reach."""
        return [*self._up.values(), *self._down.values()]


PLOTLY_BARMODE = {"stack": "relative"}
"""Plotly's own ``stack`` sums parts in order, so a negative part would hang from the running
total; ``relative`` is the rule :class:`Stacks` draws in the PDF and PNG."""


def _flat(values: List[Any]) -> List[Any]:
    return [v for item in values for v in (item if isinstance(item, list) else [item])]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value) and not math.isinf(value)


@dataclass
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] = str
    numeric: bool = True


@dataclass
class Table:
    table_id: str
    headers: List[Tuple[str, bool]]  # (text, numeric)
    rows: List[List[Tuple[str, str]]]  # (text, css class)
    csv_uri: str
    caption: str = ""
    widths: List[float] = field(default_factory=list)  # % of the table width, per column
    csv_note: str = ""  # what the CSV download holds beyond the table (HTML only: a PDF has none)


def csv_data_uri(frame: pd.DataFrame) -> str:
    """The table as a CSV download that needs no server (a data: URI)."""
    payload = base64.b64encode(csv_text(frame).encode("utf-8")).decode("ascii")
    return f"data:text/csv;base64,{payload}"


def make_table(
    table_id: str,
    frame: pd.DataFrame,
    columns: List[Column],
    caption: str = "",
    row_class: Optional[Callable[[Dict[str, Any]], str]] = None,
    csv_frame: Optional[pd.DataFrame] = None,
    csv_note: str = "",
) -> Table:
    """Format ``frame`` for display; the CSV download holds the unformatted numbers."""
    rows = []
    for record in frame_records(frame):
        css = row_class(record) if row_class else ""
        rows.append([(column.fmt(record[column.key]), css) for column in columns])
    headers = [(column.header, column.numeric) for column in columns]
    source = csv_frame if csv_frame is not None else frame[[c.key for c in columns]]
    widths = _widths(headers, rows)
    return Table(table_id, headers, rows, csv_data_uri(source), caption, widths, csv_note)


LONG_WORD = 36
"""Characters of one word (a path, a cell id) a text column's width allows for."""


def _widths(headers: List[Tuple[str, bool]], rows: List[List[Tuple[str, str]]]) -> List[float]:
    """Column widths (% of the table) from the text each column holds, so the PDF can lay tables
    out without measuring every cell (``table-layout: fixed``): never narrower than the longest
    word of the column, text capped so one long name does not starve the others."""
    sample = rows[:300]
    widths = []
    for i, (header, numeric) in enumerate(headers):
        cells = [row[i][0] for row in sample]
        # A path breaks anywhere (overflow-wrap): past LONG_WORD it takes no more room.
        cap = 10**6 if numeric else LONG_WORD
        words = [min(len(w), cap) for text in cells for w in text.split()]
        words += [len(w) for w in header.split()]
        longest = max((len(text) for text in cells), default=0)
        widths.append(max([*words, 3, min(longest, 10**6 if numeric else 20)]) + 2.5)
    total = sum(widths)
    return [round(100 * w / total, 2) for w in widths]


@dataclass
class Section:
    section_id: str
    title: str
    intro: str = ""
    charts: List[Chart] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        """Nothing measured to show (e.g. the scaling section of communication-only results)."""
        return not self.charts and not any(table.rows for table in self.tables)


def chart_data_table(chart: Chart, max_rows: int = 60) -> Optional[Table]:
    """The numbers behind a chart as a small table (None past ``max_rows``: CSV only)."""
    frame = chart.data.drop(columns=["cell_id", "config_key"], errors="ignore")
    if len(frame) > max_rows:
        return None
    columns = [
        Column(
            name,
            name.replace("_", " "),
            fmt.significant if pd.api.types.is_float_dtype(frame[name]) else fmt.text,
            pd.api.types.is_numeric_dtype(frame[name]),
        )
        for name in frame.columns
    ]
    return make_table(f"{chart.chart_id}-data", frame, columns, csv_frame=chart.data)
