"""``history report``: one static HTML page (plotly.js inline, nothing fetched), a chart per
series and metric with its change points (red, with the magnitude and the cause) and the runs
where the fingerprint changed (grey), filtered inside the page by model, GPU count and metric."""

from __future__ import annotations

import html
from itertools import groupby
from typing import Any, Dict, List

from torchscale.history.database import HistoryStore
from torchscale.history.exports import series_by_id, series_label
from torchscale.history.ingest import METRICS, PROFILE_METRICS, VALIDATE_KIND
from torchscale.history.series_changes import ChangePoint, find_changes, fingerprint_changes
from torchscale.report.plotly_charts import plotly_js, script_json

UNITS = {
    "throughput": "per second",
    "p95": "p95 step time (ms)",
    "busbw": "busbw (GB/s)",
    "sync_stall": "sync stall time (% of step)",
}

_SCRIPT = """
const figures = JSON.parse(document.getElementById('history-figures').textContent);
for (const el of document.querySelectorAll('[data-figure]')) {
  const figure = figures[el.getAttribute('data-figure')];
  Plotly.newPlot(el, figure.data, figure.layout, {displaylogo: false, responsive: true})
    .then(() => el.setAttribute('data-drawn', 'true'));
}
function applyFilter() {
  const wanted = {};
  for (const select of document.querySelectorAll('select[data-filter]')) {
    wanted[select.getAttribute('data-filter')] = select.value;
  }
  for (const box of document.querySelectorAll('.series')) {
    const shown = Object.keys(wanted).every(
      key => wanted[key] === '' || box.getAttribute('data-' + key) === wanted[key]);
    box.style.display = shown ? '' : 'none';
  }
}
for (const select of document.querySelectorAll('select[data-filter]')) {
  select.addEventListener('change', applyFilter);
}
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.series { border-top: 1px solid #ddd; padding-top: .5em; margin-top: 1em; }
.changes { font-size: .9em; color: #a00; }
.chart { height: 320px; }
.fleet .chart { height: 360px; }
"""
FLEET_BUCKET = 13
"""A fleet column is the hour a node's validate ran in (``YYYY-MM-DDTHH``): the nodes of one
fleet check, or one nightly job, land in one column; a node checked twice in the hour shows
its later figure."""


def _fleet_sections(
    store: HistoryStore, series: Dict[int, Any], figures: Dict[str, Any]
) -> List[str]:
    """The fleet view: per validate probe, a heatmap of each node's (and device's) figure over
    time, so a node that slowed down, or joined slow, stands out in its row."""
    from torchscale.hardware.expected_figures import PROBES

    sections = []
    for metric in store.metrics(VALIDATE_KIND):
        cells: Dict[Any, float] = {}
        for point in store.points(metric):
            entry = series[point.series_id]
            if entry.kind == VALIDATE_KIND:
                cells[(entry.name, point.started_at[:FLEET_BUCKET])] = point.value
        if not cells:
            continue
        nodes = sorted({node for node, _ in cells})
        columns = sorted({column for _, column in cells})
        z = [[cells.get((node, column)) for column in columns] for node in nodes]
        probe = PROBES.get(metric)
        label = probe.label if probe else metric
        unit = probe.unit if probe else ""
        chart_id = f"fleet-{metric}"
        figures[chart_id] = {
            "data": [
                {"type": "heatmap", "x": [f"{c}:00" for c in columns],
                 "y": [html.escape(n) for n in nodes], "z": z, "colorscale": "Viridis",
                 "reversescale": bool(probe and not probe.higher_is_better),
                 "colorbar": {"title": {"text": html.escape(unit)}},
                 "hovertemplate": "%{y}<br>%{x}<br>%{z:.4g} " + html.escape(unit)
                 + "<extra></extra>"}
            ],
            "layout": {"margin": {"l": 160, "r": 20, "t": 20, "b": 60},
                       "xaxis": {"type": "category"}, "yaxis": {"type": "category"}},
        }  # fmt: skip
        sections.append(
            f'<div class="fleet" data-metric="{html.escape(metric, quote=True)}">'
            f"<h3>{html.escape(label)} ({html.escape(unit)}), per node and device</h3>"
            f'<div class="chart" data-figure="{chart_id}"></div></div>'
        )
    return sections


def _figure(
    dates: List[str], values: List[float], changes: List[ChangePoint], marks: List[Any]
) -> Dict[str, Any]:
    shapes, annotations = [], []
    for date, text in marks:
        shapes.append(
            {"type": "line", "xref": "x", "yref": "paper", "x0": date, "x1": date, "y0": 0,
             "y1": 1, "line": {"color": "#999", "dash": "dot", "width": 1}}
        )  # fmt: skip
        annotations.append(
            # plotly reads tags in text (<a href>, <br>): a host's name is shown as written
            {"x": date, "y": 0.02, "xref": "x", "yref": "paper", "text": html.escape(text),
             "showarrow": False,
             "font": {"size": 10, "color": "#666"}, "textangle": -90, "xanchor": "left"}
        )  # fmt: skip
    for change in changes:
        shapes.append(
            {"type": "line", "xref": "x", "yref": "paper", "x0": change.started_at,
             "x1": change.started_at, "y0": 0, "y1": 1,
             "line": {"color": "#c00", "dash": "dash", "width": 2}}
        )  # fmt: skip
        annotations.append(
            {"x": change.started_at, "y": 1, "xref": "x", "yref": "paper", "showarrow": False,
             "text": f"{100 * change.magnitude:+.1f}%", "font": {"color": "#c00"},
             "xanchor": "left", "yanchor": "top"}
        )  # fmt: skip
    data = [{"type": "scatter", "mode": "lines+markers", "x": dates, "y": values, "name": "run"}]
    layout = {
        "margin": {"l": 60, "r": 20, "t": 20, "b": 40},
        "showlegend": False,
        "shapes": shapes,
        "annotations": annotations,
        "xaxis": {"type": "date"},
    }
    return {"data": data, "layout": layout}


def history_page(store: HistoryStore, title: str = "Performance history") -> str:
    """The whole page, as text."""
    series = series_by_id(store)
    runs = {row["id"]: row for row in store.runs()}
    figures: Dict[str, Any] = {}
    sections: List[str] = []
    charted = (*METRICS, *PROFILE_METRICS)
    for metric in charted:
        changes = find_changes(store, metric)
        for series_id, group in groupby(store.points(metric), key=lambda p: p.series_id):
            rows = list(group)
            entry = series[series_id]
            dates = [p.started_at for p in rows]
            marks = []
            for before, after in zip(rows, rows[1:]):
                diff = fingerprint_changes(
                    runs[before.run_id]["attributes"], runs[after.run_id]["attributes"]
                )
                if diff:
                    marks.append((after.started_at, "; ".join(diff)))
            own = [c for c in changes if c.series.key == entry.key]
            chart_id = f"{metric}-{series_id}"
            figures[chart_id] = _figure(dates, [p.value for p in rows], own, marks)
            lines = "".join(
                f"<li>{'regression' if c.regression else 'improvement'}"
                f"{' (open)' if c.open else ''} at run {c.position} ({html.escape(c.started_at)}):"
                f" {100 * c.magnitude:+.1f}%, p={c.pvalue:.1e}; changed: "
                f"{html.escape('; '.join(c.cause) or 'nothing in the fingerprint')}</li>"
                for c in own
            )
            sections.append(
                f'<div class="series" data-model="{html.escape(entry.name, quote=True)}" '
                f'data-gpus="{entry.gpus}" data-metric="{metric}">'
                f"<h3>{html.escape(series_label(entry))}: {html.escape(UNITS[metric])}</h3>"
                f'<ul class="changes">{lines}</ul>'
                f'<div class="chart" data-figure="{chart_id}"></div></div>'
            )
    fleet = _fleet_sections(store, series, figures)
    fleet_view = (
        "<h2 class='fleet-title'>Fleet: validate figures per node over time</h2>" + "".join(fleet)
        if fleet
        else ""
    )
    cells = [s for s in series.values() if s.kind != VALIDATE_KIND]
    shown = [m for m in charted if any(f.startswith(f"{m}-") for f in figures)]
    filters = "".join(
        _select(key, label, values)
        for key, label, values in (
            ("model", "model", sorted({s.name for s in cells})),
            ("gpus", "GPUs", sorted({str(s.gpus) for s in cells}, key=int)),
            ("metric", "metric", shown),
        )
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1 class='history-title'>{html.escape(title)}</h1>"
        f"<p>{len(runs)} runs, {len(sections)} series. Red dashed: a change point; grey dotted: "
        "a run where the versions or hosts changed.</p>"
        f"<form class='filters'>{filters}</form>{''.join(sections)}{fleet_view}"
        f"<script id='history-figures' type='application/json'>{script_json(figures)}</script>"
        f"<script>{plotly_js()}</script><script>{_SCRIPT}</script></body></html>"
    )


def _select(key: str, label: str, values: List[str]) -> str:
    options = "".join(
        f'<option value="{html.escape(v, quote=True)}">{html.escape(v)}</option>' for v in values
    )
    return (
        f"<label>{label} <select data-filter='{key}'><option value=''>all</option>"
        f"{options}</select></label> "
    )
