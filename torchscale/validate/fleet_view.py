"""The fleet report on the console: one row per node, then one per link (stderr; the document
itself goes to stdout with ``--json``), through the shared renderer (names escaped there)."""

from __future__ import annotations

from typing import Any, Dict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchscale.console_tables import Col, fitted_table
from torchscale.escaping import for_terminal as terminal_text
from torchscale.validate.display import STYLES
from torchscale.validate.probe_timing import format_value


def nodes_table(document: Dict[str, Any], console: Console) -> Table:
    """One row per node, fitted to the console (``console_tables``): every figure whole."""
    nodes = document["nodes"]
    statuses = [str(node["status"]) for node in nodes]
    cols = [
        Col("Node", [str(node["host"]) for node in nodes], numeric=False, wrap=True),
        Col("Status", statuses, numeric=False, styles=[STYLES[s] for s in statuses]),
        Col(
            "Best link GB/s",
            [format_value(n["best_link_gbps"]) if n["best_link_gbps"] else "-" for n in nodes],
            compact="Best link\nGB/s",
        ),
        Col(
            "Local P/W/F",
            [f"{n['local']['pass']}/{n['local']['warn']}/{n['local']['fail']}" for n in nodes],
            compact="Local\nP/W/F",
        ),
        Col("Why", ["; ".join(n["reasons"]) for n in nodes], numeric=False,
            fill=True),
    ]  # fmt: skip
    title = f"Fleet check: {document['nnodes']} nodes, level {document['level']}"
    return fitted_table(console, title, cols)


def links_table(document: Dict[str, Any], console: Console) -> Table:
    """One row per link measured (send/recv), fitted to the console."""
    links = document["links"]
    statuses = [str(link["status"]) for link in links]
    cols = [
        Col("Link", [f"{k['a']} <-> {k['b']}" for k in links], numeric=False,
            wrap=True),
        Col("Status", statuses, numeric=False, styles=[STYLES[s] for s in statuses]),
        Col("GB/s", [format_value(link["gbps"]) for link in links]),
        Col("Of both nodes' reach", [f"{link['ratio']:.2f}" for link in links],
            compact="Of both\nnodes' reach"),
    ]  # fmt: skip
    return fitted_table(console, "Links (send/recv busbw)", cols)


def render_fleet(document: Dict[str, Any], console: Console) -> None:
    console.print(nodes_table(document, console))
    if document["links"]:
        console.print(links_table(document, console))
    summary = document["summary"]
    parts = []
    if summary["slow_nodes"]:
        parts.append("slow node(s): " + ", ".join(summary["slow_nodes"]))
    if summary["slow_links"]:
        parts.append("slow link(s): " + ", ".join(f"{a} <-> {b}" for a, b in summary["slow_links"]))
    verdict = "; ".join(parts) or "no outlier node or link"
    console.print(
        Text.assemble((summary["status"], STYLES[summary["status"]]), ": ", terminal_text(verdict))
    )
