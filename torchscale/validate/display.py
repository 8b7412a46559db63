"""Render a validate report (the JSON document) as Rich tables on the console."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

STYLES = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "SKIP": "dim"}


WIDE = 120
"""Below this many columns the fix is stacked under the value instead of a column of its own."""


def checks_table(report: Dict[str, Any], width: int = WIDE) -> Table:
    """Check, status, value and fix; on a console narrower than ``WIDE`` (a CI log, a file: 80
    columns) the fix goes under the value, so that neither is squeezed into a narrow column."""
    title = f"torchscale validate: {report['host']}"
    if width < WIDE:
        return _stacked_table(report, title)
    table = Table(title=title, title_justify="left")
    table.add_column("Check", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Value", overflow="fold")
    table.add_column("Fix", overflow="fold")
    for check in report["checks"]:
        status = check["status"]
        table.add_row(
            check["name"], Text(status, style=STYLES[status]), check["value"], check["fix"] or ""
        )
    return table


def _stacked_table(report: Dict[str, Any], title: str) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("Status", no_wrap=True)
    table.add_column("Check", no_wrap=True)
    table.add_column("Value (and how to fix it)", overflow="fold", ratio=1)
    for check in report["checks"]:
        status = check["status"]
        cell = Text(check["value"])
        if check["fix"]:
            cell.append("\nfix: " + check["fix"], style="dim")
        table.add_row(Text(status, style=STYLES[status]), check["name"], cell)
    return table


def topology_table(report: Dict[str, Any]) -> Optional[Table]:
    """The GPU x GPU matrix, as ``nvidia-smi topo -m`` shows it; None with fewer than 2 GPUs."""
    topology = next((c for c in report["checks"] if c["name"] == "GPU topology"), None)
    matrix: List[List[str]] = (topology or {}).get("details", {}).get("matrix", [])
    if len(matrix) < 2:
        return None
    table = Table(title="GPU topology (as nvidia-smi topo -m)", title_justify="left")
    table.add_column("")
    for i in range(len(matrix)):
        table.add_column(f"GPU{i}", justify="center")
    for i, row in enumerate(matrix):
        table.add_row(f"GPU{i}", *row)
    return table


def summary_line(report: Dict[str, Any]) -> Text:
    s = report["summary"]
    counts = f"{s['pass']} PASS, {s['warn']} WARN, {s['fail']} FAIL, {s['skip']} SKIP"
    if not s["ok"]:
        verdict, style = "not ready: fix the FAIL rows first", "bold red"
    elif report["backend"] == "gloo":
        verdict, style = "ready for CPU (gloo) benchmarking only", "bold yellow"
    else:
        verdict, style = "ready for DDP with NCCL", "bold green"
    return Text.assemble(f"{counts} in {report['duration_s']:.1f} s: ", (verdict, style))


def render(report: Dict[str, Any], console: Console) -> None:
    console.print(checks_table(report, console.width))
    topology = topology_table(report)
    if topology is not None:
        console.print(topology)
        legend = next(c for c in report["checks"] if c["name"] == "GPU topology")["details"]
        console.print("Legend: " + "; ".join(f"{k} = {v}" for k, v in legend["legend"].items()))
    console.print(summary_line(report))
