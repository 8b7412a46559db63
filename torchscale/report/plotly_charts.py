"""Chart specs -> Plotly figure JSON for the HTML report (drawn by the embedded plotly.js).

Figures are plain Plotly JSON (``{"data": [...], "layout": {...}}``), built without
``plotly.graph_objects`` validation so that a thousand cells still render in a second; the tests
validate every figure against Plotly's schema instead.

Plotly reads trace names, titles and category labels as pseudo-HTML, so every text that can come
from a config is HTML-escaped here: a model called ``<b>x</b>`` shows those characters.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any, Dict, List

from torchscale.report.elements import PLOTLY_BARMODE, REFERENCE_COLOR, Chart, Series

FONT = "Inter, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
GRID = "#E5E7EB"


def _text(value: Any) -> Any:
    return html.escape(value, quote=False) if isinstance(value, str) else value


def _values(values: List[Any]) -> List[Any]:
    """JSON-safe: NaN and infinities become gaps (null), strings are escaped."""
    return [
        None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else _text(v)
        for v in values
    ]


def _rgba(color: str, alpha: float) -> str:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def _trace(series: Series, color: str) -> Dict[str, object]:
    common = {
        "name": _text(series.name),
        "showlegend": series.show_legend,
        "legendgroup": _text(series.color_key or series.name),
    }
    if series.kind == "box":
        xs = [_text(label) for label, samples in zip(series.x, series.y) for _ in samples]
        ys = [v for samples in series.y for v in samples]
        return {
            **common,
            "type": "box",
            "x": xs,
            "y": _values(ys),
            "boxpoints": "outliers",
            "marker": {"color": color, "size": 3},
            "line": {"width": 1.2},
        }
    x, y = _values(series.x), _values(series.y)
    if series.kind == "bar":
        bar = {**common, "type": "bar", "x": x, "y": y, "marker": {"color": color}}
        if any(v is not None for v in _values([*(series.low or []), *(series.high or [])])):
            bar["error_y"] = _interval(series)
        return bar
    if series.kind == "marker":
        return {
            **common,
            "type": "scatter",
            "mode": "markers",
            "x": x,
            "y": y,
            "marker": {"color": color, "size": 8, "symbol": "diamond"},
        }
    return {
        **common,
        "type": "scatter",
        "mode": "lines+markers",
        "x": x,
        "y": y,
        "line": {"color": color, "width": 2, "dash": "dash" if series.dashed else "solid"},
        "marker": {"size": 6},
    }


def _interval(series: Series) -> Dict[str, object]:
    """Plotly's asymmetric error bar from each point's interval ends (a gap where none)."""

    def gap(ends: List[Any], sign: float) -> List[Any]:
        return _values(
            [
                sign * (float(end) - float(value))
                if end is not None and value is not None
                else float("nan")
                for end, value in zip(ends, series.y)
            ]
        )

    return {
        "type": "data",
        "symmetric": False,
        "array": gap(series.high or [], 1.0),
        "arrayminus": gap(series.low or [], -1.0),
        "color": "#111827",
        "thickness": 1.5,
        "width": 6,
    }


def figure(chart: Chart) -> Dict[str, object]:
    colors = chart.colors()
    traces = []
    for series in chart.series:
        key = series.color_key or series.name
        color = REFERENCE_COLOR if key == "__ideal" else colors[key]
        traces.append(_trace(series, color))
    shapes: List[Dict[str, object]] = []
    annotations: List[Dict[str, object]] = []
    for band in chart.bands:
        shapes.append(
            {
                "type": "rect",
                "xref": "paper",
                "yref": "y",
                "x0": 0,
                "x1": 1,
                "y0": band.low,
                "y1": band.high,
                "line": {"width": 0},
                "layer": "below",
                "fillcolor": _rgba(*band.color),
            }
        )
        # Named in the legend: a label on the plot would sit on the data line.
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [None],
                "y": [None],
                "name": _text(band.label),
                "showlegend": True,
                "hoverinfo": "skip",
                "marker": {
                    "symbol": "square",
                    "size": 12,
                    "color": _rgba(band.color[0], min(1.0, 2.5 * band.color[1])),
                },
            }
        )
    for value, label in chart.hlines:
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "yref": "y",
                "x0": 0,
                "x1": 1,
                "y0": value,
                "y1": value,
                "line": {"color": REFERENCE_COLOR, "width": 1.5, "dash": "dot"},
            }
        )
        annotations.append(
            {
                "xref": "paper",
                "yref": "y",
                "x": 0,
                "y": value,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
                "text": _text(label),
                "font": {"size": 10, "color": "#4B5563"},
            }
        )
    xaxis: Dict[str, object] = {
        "title": {"text": _text(chart.x_title)},
        "type": chart.x_type,
        "gridcolor": GRID,
        "zeroline": False,
        "automargin": True,
    }
    if chart.x_ticks:
        xaxis["tickmode"] = "array"
        xaxis["tickvals"] = chart.x_ticks
    legend: Dict[str, object] = {"orientation": "h", "y": -0.18, "x": 0, "font": {"size": 11}}
    if chart.long_categories():
        # Slanted labels fill the space under the axis: the legend goes to the right.
        xaxis["tickangle"] = -30
        legend = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "font": {"size": 11}}
    yaxis: Dict[str, object] = {
        "title": {"text": _text(chart.y_title)},
        "type": chart.y_type,
        "gridcolor": GRID,
        "zeroline": False,
        "rangemode": "tozero" if chart.y_from_zero else "normal",
        "automargin": True,
    }
    if chart.y_range:
        yaxis["range"] = list(chart.y_range)
    layout = {
        "title": {
            "text": _text(chart.title),
            "x": 0,
            "xanchor": "left",
            "font": {"size": 15, "color": "#111827"},
        },
        "font": {"family": FONT, "size": 12, "color": "#374151"},
        "paper_bgcolor": "#FFFFFF",
        "plot_bgcolor": "#FFFFFF",
        "margin": {"l": 60, "r": 20, "t": 48, "b": 40},
        "height": 380,
        "xaxis": xaxis,
        "yaxis": yaxis,
        "barmode": PLOTLY_BARMODE.get(chart.barmode, chart.barmode),
        "boxmode": "overlay",
        "legend": legend,
        "hovermode": "closest",
        "shapes": shapes,
        "annotations": annotations,
    }
    return {"data": traces, "layout": layout}


def figures_json(charts: List[Chart]) -> str:
    """Every figure keyed by chart id, safe to place inside a ``<script>`` element."""
    return script_json({c.chart_id: figure(c) for c in charts})


def script_json(value: object) -> str:
    """``value`` as JSON safe to place inside a ``<script>`` element."""
    document = json.dumps(value, separators=(",", ":"), allow_nan=False)
    # "</script>" or "<!--" in a name must not end or alter the script element.
    return (
        document.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def plotly_js() -> str:
    """The plotly.js bundle shipped inside the installed plotly package (never a CDN)."""
    from plotly.offline import get_plotlyjs

    bundle: str = get_plotlyjs()  # plotly is untyped
    return bundle.replace("</script", "<\\/script")
