"""The fleet report as one self-contained HTML page (``validate/fleet.html``): the verdicts, a
node x device heatmap per probe and a node x node heatmap of the links.

Every text comes from other nodes (host names, device names): Jinja's autoescape writes it as
text. A cell's colour is its ratio to the fleet median on a red-amber-green scale anchored at
the thresholds, and its figure is printed in it, so the page reads without colour too.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from jinja2 import Environment

from torchscale.validate.probe_timing import format_value

COLORS = {"PASS": "#dcfce7", "WARN": "#fef3c7", "FAIL": "#fee2e2", "SKIP": "#f3f4f6"}

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>torchscale validate --fleet: {{ nnodes }} nodes</title>
<style>
body { font-family: Inter, -apple-system, 'Segoe UI', Roboto, Arial, sans-serif; margin: 2em;
       color: #111827; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #e5e7eb; padding: 4px 8px; text-align: right; font-size: 13px; }
th { background: #f9fafb; } td.name, th.name { text-align: left; }
.PASS { color: #166534; } .WARN { color: #92400e; } .FAIL { color: #991b1b; font-weight: bold; }
small { color: #6b7280; }
</style></head><body>
<h1>Fleet check: {{ nnodes }} nodes, level {{ level }}</h1>
<p class="{{ status }}">{{ status }}{% if slow_nodes %}: slow node(s) {{ slow_nodes|join(", ") }}
{%- endif %}{% if slow_links %}; slow link(s) {{ slow_links|join(", ") }}{% endif %}</p>
<h2>Nodes</h2>
<table><tr><th class="name">node</th><th class="name">status</th><th>best link GB/s</th>
<th>local checks (pass/warn/fail)</th><th class="name">why</th></tr>
{% for n in nodes %}<tr><td class="name">{{ n.host }}</td><td class="name {{ n.status }}">
{{ n.status }}</td><td>{{ n.link }}</td><td>{{ n.local }}</td><td class="name">
{{ n.reasons|join("; ") }}</td></tr>
{% endfor %}</table>
<h2>Links (send/recv busbw, GB/s)</h2>
<table><tr><th class="name"></th>{% for h in hosts %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in link_matrix %}<tr><th class="name">{{ row.host }}</th>
{% for cell in row.cells %}<td style="background:{{ cell.color }}" title="{{ cell.title }}">
{{ cell.text }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% for probe in heatmaps %}<h2>{{ probe.label }} ({{ probe.unit }})</h2>
<small>colour: ratio to the fleet median; WARN below {{ warn }}, FAIL below {{ fail }}</small>
<table><tr><th class="name">node</th>{% for d in probe.devices %}<th>{{ d }}</th>{% endfor %}</tr>
{% for row in probe.rows %}<tr><th class="name">{{ row.host }}</th>
{% for cell in row.cells %}<td style="background:{{ cell.color }}" title="{{ cell.title }}">
{{ cell.text }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% endfor %}
</body></html>
"""


def _device_order(name: str) -> Tuple[str, List[int]]:
    """``GPU 2`` before ``GPU 10``; ``GPU 0->1`` after ``GPU 0``."""
    return re.sub(r"\d+", "", name), [int(n) for n in re.findall(r"\d+", name)]


def _cell(status: Optional[str], text: str, title: str) -> Dict[str, str]:
    return {"color": COLORS.get(status or "SKIP", COLORS["SKIP"]), "text": text, "title": title}


def _heatmaps(document: Dict[str, Any], hosts: List[str]) -> List[Dict[str, Any]]:
    maps = []
    cells = document["cells"]
    for probe in dict.fromkeys(c["probe"] for c in cells):
        mine = [c for c in cells if c["probe"] == probe]
        devices = sorted({c["device"] for c in mine}, key=_device_order)
        found = {(c["host"], c["device"]): c for c in mine}
        rows = []
        for host in hosts:
            row = []
            for device in devices:
                c = found.get((host, device))
                if c is None:
                    row.append(_cell(None, "", "not measured"))
                    continue
                share = c["vs_fleet"]
                title = f"{c['status']}: {share:.2f} of the fleet median" if share else c["status"]
                row.append(_cell(c["status"], format_value(float(c["value"])), title))
            rows.append({"host": host, "cells": row})
        first = mine[0]
        maps.append(
            {"label": first["label"], "unit": first["unit"], "devices": devices, "rows": rows}
        )
    return maps


def _link_matrix(document: Dict[str, Any], hosts: List[str]) -> List[Dict[str, Any]]:
    links = {}
    for link in document["links"]:
        links[(link["a"], link["b"])] = links[(link["b"], link["a"])] = link
    rows = []
    for a in hosts:
        row = []
        for b in hosts:
            link = links.get((a, b))
            if a == b or link is None:
                row.append(_cell(None, "" if a == b else "-", "not measured"))
                continue
            title = f"{link['status']}: {link['ratio']:.2f} of what both nodes reach elsewhere"
            row.append(_cell(link["status"], format_value(float(link["gbps"])), title))
        rows.append({"host": a, "cells": row})
    return rows


def fleet_html(document: Dict[str, Any]) -> str:
    hosts = [n["host"] for n in document["nodes"]]
    nodes = [
        {
            "host": n["host"],
            "status": n["status"],
            "link": format_value(n["best_link_gbps"]) if n["best_link_gbps"] else "-",
            "local": "/".join(str(n["local"][k]) for k in ("pass", "warn", "fail")),
            "reasons": n["reasons"],
        }
        for n in document["nodes"]
    ]
    summary = document["summary"]
    fleet = document["thresholds"]["fleet"]
    template = Environment(autoescape=True).from_string(TEMPLATE)
    return template.render(
        nnodes=document["nnodes"],
        level=document["level"],
        status=summary["status"],
        slow_nodes=summary["slow_nodes"],
        slow_links=[f"{a} <-> {b}" for a, b in summary["slow_links"]],
        nodes=nodes,
        hosts=hosts,
        link_matrix=_link_matrix(document, hosts),
        heatmaps=_heatmaps(document, hosts),
        warn=fleet["warn"],
        fail=fleet["fail"],
    )
