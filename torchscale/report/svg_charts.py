"""Chart specs -> static SVG for the PDF report, written directly (no browser, no plotting library).

WeasyPrint draws SVG node by node, so each chart is kept to a few dozen elements: one path per
series (markers included as zero-length round-capped segments), one path for the grid. Writing the
SVG here instead of through matplotlib made a 1,000-cell PDF several times faster (see
docs/perf-report.md). Every text goes through XML escaping.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from torchscale.report.elements import REFERENCE_COLOR, Chart, Series, Stacks

WIDTH, HEIGHT = 760.0, 310.0
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
TEXT, MUTED, GRID, AXIS = "#111827", "#4B5563", "#E5E7EB", "#9CA3AF"
CHAR_W = 6.1  # average advance of an 11 px sans-serif character, for layout estimates
LEGEND_MAX = 200.0


def _num(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def nice_ticks(low: float, high: float, count: int = 5) -> List[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering [low, high]."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = [first + i * step for i in range(math.ceil((high - first) / step - 1e-9) + 1)]
    return [round(t, 12) for t in ticks]


def tick_label(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:g}k"
    return f"{value:,.10g}" if magnitude >= 1 else f"{value:.3g}"


def bytes_label(value: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"


def _text(
    x: float,
    y: float,
    content: str,
    size: float = 11,
    anchor: str = "start",
    color: str = MUTED,
    weight: str = "normal",
    rotate: Optional[float] = None,
) -> str:
    transform = f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"' if rotate else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}" text-anchor="{anchor}" '
        f'fill="{color}" font-weight="{weight}"{transform}>{escape(content)}</text>'
    )


LABEL_LINE = 26
"""Characters per line of a slanted category label; a longer label wraps (never cut)."""
LABEL_LINES = 3


def wrap_label(label: str, width: int = LABEL_LINE) -> List[str]:
    """A slanted category label as lines of at most ``width`` characters, broken at spaces (a
    word longer than a line gets a line of its own); only past ``LABEL_LINES`` lines is the last
    one cut, and the data table has the label whole."""
    lines: List[str] = []
    for word in label.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) > LABEL_LINES:
        rest = " ".join(lines[LABEL_LINES - 1 :])
        lines = [*lines[: LABEL_LINES - 1], rest if len(rest) <= width else rest[: width - 1] + "…"]
    return lines


def _lines(x: float, y: float, lines: List[str], size: float, rotate: float) -> str:
    """Several lines of end-anchored text, slanted together about (x, y)."""
    spans = "".join(
        f'<tspan x="{x:.1f}" dy="{0 if i == 0 else size * 1.15:.1f}">{escape(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}" text-anchor="end" fill="{MUTED}" '
        f'transform="rotate({rotate:g} {x:.1f} {y:.1f})">{spans}</text>'
    )


def _width(content: str, size: float = 11) -> float:
    return len(content) * CHAR_W * size / 11


class _Frame:
    """Maps data to pixels for the plot area."""

    def __init__(self, chart: Chart, categories: List[str]) -> None:
        self.chart = chart
        self.categories = categories
        values = self._values()
        low = min(values, default=0.0)
        high = max(values, default=1.0)
        # Distributions get a margin below their smallest value instead of a zero baseline.
        low = min(0.0, low) if chart.y_from_zero else max(0.0, low - 0.08 * (high - low))
        for value, _ in chart.hlines:
            low, high = min(low, value), max(high, value)
        if chart.y_range:
            low, high = chart.y_range
        self.y_ticks = nice_ticks(low, high + 0.04 * (high - low))
        if chart.y_range:
            self.y_ticks = [t for t in self.y_ticks if low <= t <= high]
        self.y_low, self.y_high = (
            (low, high) if chart.y_range else (self.y_ticks[0], self.y_ticks[-1])
        )
        labels = [tick_label(t) for t in self.y_ticks]
        self.legend = [s for s in chart.series if s.show_legend]
        names = [s.name for s in self.legend] + [band.label for band in chart.bands]
        legend_w = min(LEGEND_MAX, max((_width(n, 10) for n in names), default=0) + 30)
        self.left = 30 + max(_width(label) for label in labels)
        self.right = WIDTH - (legend_w + 12 if names else 16)
        self.top = 36.0
        band = (self.right - self.left) / max(1, len(categories))
        self.rotated = chart.x_type == "category" and (
            max((_width(c, 10) for c in categories), default=0) > 0.9 * band
        )
        wrapped = [wrap_label(c) for c in categories]
        if self.rotated and categories:  # the first slanted label must not leave the canvas
            first = max(_width(line, 10) for line in wrapped[0])
            self.left = max(self.left, 0.87 * first + 8 - band / 2)
        longest = max((len(line) for lines in wrapped for line in lines), default=0)
        deepest = max((len(lines) for lines in wrapped), default=1)
        room = 22 + longest * CHAR_W * 0.55 + (deepest - 1) * 11
        self.bottom = HEIGHT - (min(130.0, room) if self.rotated else 42)
        self._x_domain()

    def _values(self) -> List[float]:
        """Every value the axis must hold: the points, their intervals' ends and, for stacked
        bars, each stack's ends (positive parts up from zero, negative ones down: ``Stacks``)."""
        values = []
        stacks = Stacks()
        for series in self.chart.series:
            for item in [*series.y, *(series.low or []), *(series.high or [])]:
                items = item if isinstance(item, list) else [item]
                values += [v for v in map(_num, items) if math.isfinite(v)]
            if series.kind == "bar" and self.chart.barmode == "stack":
                for x, value in zip(series.x, map(_num, series.y)):
                    if math.isfinite(value):
                        stacks.place(str(x), value)
        return values + stacks.extents()

    def _x_domain(self) -> None:
        xs = [v for s in self.chart.series for v in map(_num, s.x) if math.isfinite(v)]
        if self.chart.x_type == "log":
            xs = [math.log2(v) for v in xs if v > 0]
        low, high = (min(xs), max(xs)) if xs else (0.0, 1.0)
        pad = (high - low) * 0.04 or 0.5
        self.x_low, self.x_high = low - pad, high + pad

    def x(self, value: Any) -> float:
        span = self.right - self.left
        if self.chart.x_type == "category":
            return self.left + span * (self.categories.index(value) + 0.5) / len(self.categories)
        v = math.log2(value) if self.chart.x_type == "log" else float(value)
        return self.left + span * (v - self.x_low) / (self.x_high - self.x_low)

    def y(self, value: float) -> float:
        span = self.bottom - self.top
        return self.bottom - span * (value - self.y_low) / ((self.y_high - self.y_low) or 1)

    def y_inside(self, value: float) -> float:
        """``y``, kept within the plot area: nothing drawn reaches the title above it."""
        return min(self.bottom, max(self.top, self.y(value)))

    @property
    def band(self) -> float:
        return (self.right - self.left) / max(1, len(self.categories))


def _axes(frame: _Frame) -> List[str]:
    chart, parts = frame.chart, []
    grid = "".join(f"M{frame.left:.1f} {frame.y(t):.1f}H{frame.right:.1f}" for t in frame.y_ticks)
    parts.append(f'<path d="{grid}" stroke="{GRID}" stroke-width="1" fill="none"/>')
    for tick in frame.y_ticks:
        parts.append(_text(frame.left - 6, frame.y(tick) + 4, tick_label(tick), anchor="end"))
    if chart.x_type == "category":
        for name in frame.categories:
            x = frame.x(name)
            if frame.rotated:
                parts.append(_lines(x + 3, frame.bottom + 14, wrap_label(name), 10, -30))
            else:
                parts.append(_text(x, frame.bottom + 16, name, 10, "middle"))
    else:
        if chart.x_type == "log":
            low, high = math.ceil(frame.x_low), math.floor(frame.x_high)
            step = max(1, math.ceil((high - low + 1) / 8))
            ticks = [2.0**p for p in range(low, high + 1, step)]
            label = bytes_label
        else:
            ticks = chart.x_ticks or nice_ticks(frame.x_low, frame.x_high)
            label = tick_label
        vertical = "".join(f"M{frame.x(t):.1f} {frame.top:.1f}V{frame.bottom:.1f}" for t in ticks)
        parts.append(f'<path d="{vertical}" stroke="{GRID}" stroke-width="1" fill="none"/>')
        parts += [_text(frame.x(t), frame.bottom + 16, label(t), 10, "middle") for t in ticks]
        parts.append(
            _text((frame.left + frame.right) / 2, HEIGHT - 8, chart.x_title, 11, "middle", TEXT)
        )
    parts.append(
        f'<path d="M{frame.left:.1f} {frame.bottom:.1f}H{frame.right:.1f}" '
        f'stroke="{AXIS}" stroke-width="1"/>'
    )
    middle = (frame.top + frame.bottom) / 2
    parts.append(_text(14, middle, chart.y_title, 11, "middle", TEXT, rotate=-90))
    return parts


def _dots(points: Sequence[Tuple[float, float]]) -> str:
    return "".join(f"M{x:.1f} {y:.1f}h0" for x, y in points)


def _line(frame: _Frame, series: Series, color: str) -> List[str]:
    points = [
        (frame.x(x), frame.y(y))
        for x, y in zip(series.x, map(_num, series.y))
        if math.isfinite(y) and (frame.chart.x_type != "log" or _num(x) > 0)
    ]
    if not points:
        return []
    path = "M" + "L".join(f"{x:.1f} {y:.1f}" for x, y in points)
    dash = ' stroke-dasharray="6 4"' if series.dashed else ""
    return [
        f'<path d="{path}" stroke="{color}" stroke-width="2" fill="none"{dash}/>',
        f'<path d="{_dots(points)}" stroke="{color}" stroke-width="6" stroke-linecap="round"/>',
    ]


def _bars(
    frame: _Frame, series: Series, color: str, index: int, count: int, stacks: Stacks
) -> List[str]:
    stacked = frame.chart.barmode == "stack"
    shared = stacked or frame.chart.barmode == "overlay"  # one bar slot per category
    width = frame.band * 0.7 / (1 if shared else count)
    path = whiskers = ""
    lows = map(_num, series.low or [None] * len(series.x))
    highs = map(_num, series.high or [None] * len(series.x))
    for x, value, low, high in zip(series.x, map(_num, series.y), lows, highs):
        if not math.isfinite(value):
            continue
        base = stacks.place(x, value) if stacked else 0.0
        left = frame.x(x) - frame.band * 0.35 + (0 if shared else index * width)
        top, bottom = frame.y_inside(base + value), frame.y_inside(base)
        path += f"M{left:.1f} {min(top, bottom):.1f}h{width:.1f}V{max(top, bottom):.1f}H{left:.1f}Z"
        if math.isfinite(low) and math.isfinite(high):
            middle, cap = left + width / 2, min(6.0, width / 4)
            y_low, y_high = frame.y_inside(low), frame.y_inside(high)
            whiskers += (
                f"M{middle:.1f} {y_low:.1f}V{y_high:.1f}M{middle - cap:.1f} {y_low:.1f}"
                f"h{2 * cap:.1f}M{middle - cap:.1f} {y_high:.1f}h{2 * cap:.1f}"
            )
    parts = [f'<path d="{path}" fill="{color}"/>'] if path else []
    if whiskers:
        parts.append(f'<path d="{whiskers}" stroke="{TEXT}" stroke-width="1.5" fill="none"/>')
    return parts


def _boxes(frame: _Frame, series: Series, color: str) -> List[str]:
    boxes = lines = outliers = ""
    half = min(frame.band * 0.3, 28)
    for name, samples in zip(series.x, series.y):
        values = np.asarray([v for v in map(_num, samples) if math.isfinite(v)])
        if not len(values):
            continue
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        reach = 1.5 * (q3 - q1)
        inside = values[(values >= q1 - reach) & (values <= q3 + reach)]
        low, high = inside.min(), inside.max()
        x = frame.x(name)
        boxes += (
            f"M{x - half:.1f} {frame.y(q3):.1f}H{x + half:.1f}V{frame.y(q1):.1f}H{x - half:.1f}Z"
        )
        lines += (
            f"M{x - half:.1f} {frame.y(median):.1f}H{x + half:.1f}"
            f"M{x:.1f} {frame.y(q3):.1f}V{frame.y(high):.1f}M{x:.1f} {frame.y(q1):.1f}"
            f"V{frame.y(low):.1f}M{x - half / 2:.1f} {frame.y(high):.1f}H{x + half / 2:.1f}"
            f"M{x - half / 2:.1f} {frame.y(low):.1f}H{x + half / 2:.1f}"
        )
        outliers += _dots([(x, frame.y(v)) for v in values[(values < low) | (values > high)]])
    return [
        f'<path d="{boxes}" fill="{color}" fill-opacity="0.3" stroke="{color}" '
        'stroke-width="1.2"/>',
        f'<path d="{lines}" stroke="{TEXT}" stroke-width="1.2" fill="none"/>',
        f'<path d="{outliers}" stroke="{color}" stroke-width="3" stroke-linecap="round"/>',
    ]


def _markers(frame: _Frame, series: Series, color: str) -> List[str]:
    path = "".join(
        f"M{frame.x(x):.1f} {frame.y(y) - 5:.1f}l4 5l-4 5l-4 -5Z"
        for x, y in zip(series.x, map(_num, series.y))
        if math.isfinite(y)
    )
    return (
        [f'<path d="{path}" fill="{color}" stroke="#FFFFFF" stroke-width="0.8"/>'] if path else []
    )


def _references(frame: _Frame) -> Tuple[List[str], List[str]]:
    """(behind the data, in front of it)."""
    below, above = [], []
    for band in frame.chart.bands:
        top, bottom = frame.y(min(band.high, frame.y_high)), frame.y(max(band.low, frame.y_low))
        below.append(
            f'<rect x="{frame.left:.1f}" y="{top:.1f}" width="{frame.right - frame.left:.1f}" '
            f'height="{bottom - top:.1f}" fill="{band.color[0]}" fill-opacity="{band.color[1]}"/>'
        )  # its label is a legend entry: text on the plot would sit on the data line
    for value, label in frame.chart.hlines:
        y = frame.y(value)
        above.append(
            f'<path d="M{frame.left:.1f} {y:.1f}H{frame.right:.1f}" stroke="{REFERENCE_COLOR}" '
            'stroke-width="1.5" stroke-dasharray="2 3"/>'
        )
        above.append(_text(frame.left + 4, y - 4, label, 9.5))
    return below, above


def _legend(frame: _Frame, colors: Dict[str, str]) -> List[str]:
    parts, y = [], frame.top + 4
    for series in frame.legend:
        color = _color(series, colors)
        x = frame.right + 14
        if series.kind in ("bar", "box"):
            parts.append(
                f'<rect x="{x:.1f}" y="{y - 8:.1f}" width="14" height="10" fill="{color}"/>'
            )
        elif series.kind == "marker":
            parts.append(f'<path d="M{x + 7:.1f} {y - 8:.1f}l4 5l-4 5l-4 -5Z" fill="{color}"/>')
        else:
            dash = ' stroke-dasharray="4 3"' if series.dashed else ""
            parts.append(
                f'<path d="M{x:.1f} {y - 3:.1f}h16" stroke="{color}" stroke-width="2"{dash}/>'
            )
        y = _legend_label(parts, x, y, series.name)
    for band in frame.chart.bands:
        x = frame.right + 14
        parts.append(
            f'<rect x="{x:.1f}" y="{y - 8:.1f}" width="14" height="10" fill="{band.color[0]}" '
            f'fill-opacity="{min(1.0, 2.5 * band.color[1]):.2f}"/>'
        )
        y = _legend_label(parts, x, y, band.label)
    return parts


def _legend_label(parts: List[str], x: float, y: float, name: str) -> float:
    """The entry's text, on two lines when long (never cut); returns where the next goes."""
    room = (LEGEND_MAX - 30) / (CHAR_W * 10 / 11)
    lines = [name]
    if len(name) > room:
        cut = name.rfind(" ", 0, int(room))
        cut = cut if cut > 0 else int(room)
        lines = [name[:cut].rstrip(), name[cut:].strip()]
        lines[1] = lines[1] if len(lines[1]) <= room else lines[1][: int(room) - 1] + "…"
    for line in lines:
        parts.append(_text(x + 21, y + 1, line, 10, color=TEXT))
        y += 13
    return y + 3


def _color(series: Series, colors: Dict[str, str]) -> str:
    key = series.color_key or series.name
    return REFERENCE_COLOR if key == "__ideal" else colors[key]


def svg(chart: Chart) -> str:
    """The chart as a standalone SVG document."""
    categories = list(dict.fromkeys(str(x) for s in chart.series for x in s.x))
    if chart.x_type == "category":
        chart = _with_text_categories(chart)
    frame = _Frame(chart, categories)
    colors = chart.colors()
    below, above = _references(frame)
    body: List[str] = []
    bars = [s for s in chart.series if s.kind == "bar"]
    stacks = Stacks()
    for series in chart.series:
        color = _color(series, colors)
        if series.kind == "bar":
            body += _bars(frame, series, color, bars.index(series), len(bars), stacks)
        elif series.kind == "box":
            body += _boxes(frame, series, color)
        elif series.kind == "marker":
            body += _markers(frame, series, color)
        else:
            body += _line(frame, series, color)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH:g} {HEIGHT:g}" '
        f'width="{WIDTH:g}" height="{HEIGHT:g}" font-family="{FONT}">',
        f'<rect width="{WIDTH:g}" height="{HEIGHT:g}" fill="#FFFFFF"/>',
        _text(8, 20, chart.title, 13, color=TEXT, weight="bold"),
        *below,
        *_axes(frame),
        *body,
        *above,
        *_legend(frame, colors),
        "</svg>",
    ]
    return "\n".join(parts)


def _with_text_categories(chart: Chart) -> Chart:
    from dataclasses import replace

    series = [replace(s, x=[str(x) for x in s.x]) for s in chart.series]
    return replace(chart, series=series)
