"""The fleet report on the console: one row per node, then one per link (stderr; the document
itself goes to stdout with ``--json``)."""

from __future__ import annotations

from typing import Any, Dict

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchscale.escaping import for_terminal as terminal_text
from torchscale.validate.display import STYLES
from torchscale.validate.probe_timing import format_value


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def nodes_table(document: Dict[str, Any]) -> Table:
    table = _table(f"Fleet check: {document['nnodes']} nodes, level {document['level']}")
    table.add_column("Node", overflow="fold")
    table.add_column("Status", no_wrap=True)
    table.add_column("Best link", justify="right", no_wrap=True)
    table.add_column("Local P/W/F", justify="right", no_wrap=True)
    table.add_column("Why", overflow="fold", ratio=1)
    for node in document["nodes"]:
        local = node["local"]
        best = node["best_link_gbps"]
        table.add_row(
            terminal_text(node["host"]),
            Text(node["status"], style=STYLES[node["status"]]),
            f"{format_value(best)} GB/s" if best else "-",
            f"{local['pass']}/{local['warn']}/{local['fail']}",
            terminal_text("; ".join(node["reasons"])),
        )
    return table


def links_table(document: Dict[str, Any]) -> Table:
    table = _table("Links (send/recv busbw)")
    table.add_column("Link", overflow="fold")
    table.add_column("Status", no_wrap=True)
    table.add_column("GB/s", justify="right", no_wrap=True)
    table.add_column("Of both nodes' reach", justify="right", no_wrap=True)
    for link in document["links"]:
        table.add_row(
            terminal_text(f"{link['a']} <-> {link['b']}"),
            Text(link["status"], style=STYLES[link["status"]]),
            format_value(link["gbps"]),
            f"{link['ratio']:.2f}",
        )
    return table


def render_fleet(document: Dict[str, Any], console: Console) -> None:
    console.print(nodes_table(document))
    if document["links"]:
        console.print(links_table(document))
    summary = document["summary"]
    parts = []
    if summary["slow_nodes"]:
        parts.append("slow node(s): " + ", ".join(summary["slow_nodes"]))
    if summary["slow_links"]:
        parts.append("slow link(s): " + ", ".join(f"{a} <-> {b}" for a, b in summary["slow_links"]))
    verdict = "; ".join(parts) or "no outlier node or link"
    console.print(
        Text.assemble(
            (summary["status"], STYLES[summary["status"]]), ": ", terminal_text(verdict)
        )
    )
