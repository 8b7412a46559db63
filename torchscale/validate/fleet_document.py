"""The fleet report (``validate --fleet --json``, ``validate/fleet.json``): per node its verdict
and reasons, per link its bandwidth and verdict, per device and probe its figure against the
fleet, and every node's own report."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from torchscale.config.validate_section import ValidateSection
from torchscale.validate.fleet_rules import FleetVerdict, Link
from torchscale.validate.result import Status, worst
from torchscale.version import __version__


def _local(report: Dict[str, Any]) -> Dict[str, Any]:
    summary = report.get("summary") or {}
    return {key: summary.get(key, 0) for key in ("pass", "warn", "fail", "skip")}


def fleet_document(
    reports: Sequence[Dict[str, Any]],
    links: Sequence[Link],
    verdict: FleetVerdict,
    settings: ValidateSection,
) -> Dict[str, Any]:
    hosts = [str(r["host"]) for r in reports]
    nodes: List[Dict[str, Any]] = []
    for rank, report in enumerate(reports):
        local = _local(report)
        reach = verdict.reach.get(rank)
        nodes.append(
            {
                "node_rank": rank,
                "host": hosts[rank],
                "status": verdict.node_status[rank].value,
                "reasons": verdict.reasons[rank],
                "local": local,
                "best_link_gbps": reach,
                "level": report.get("level", 1),
            }
        )
    link_rows = [
        {
            "a": hosts[v.link.pair[0]],
            "b": hosts[v.link.pair[1]],
            "gbps": v.link.gbps,
            "samples": list(v.link.samples),
            "expected_gbps": v.expected_gbps,
            "ratio": v.ratio,
            "status": v.status.value,
        }
        for v in sorted(verdict.links, key=lambda v: v.link.pair)
    ]
    statuses = [verdict.node_status[r] for r in range(len(reports))]
    statuses += [v.status for v in verdict.links]
    local_fail = any(n["local"]["fail"] for n in nodes)
    overall = worst([Status.PASS, *statuses])
    return {
        "torchscale": __version__,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "nnodes": len(reports),
        "level": max((int(r.get("level", 1)) for r in reports), default=1),
        "summary": {
            "status": overall.value,
            "slow_nodes": [hosts[n] for n in verdict.slow_nodes],
            "slow_links": [[hosts[a], hosts[b]] for a, b in verdict.slow_links],
            "nodes_with_failed_checks": [n["host"] for n in nodes if n["local"]["fail"]],
            "ok": overall is not Status.FAIL and not local_fail,
        },
        "thresholds": {
            "fleet": settings.fleet.model_dump(),
            "links": settings.links.model_dump(),
        },
        "nodes": nodes,
        "links": link_rows,
        "cells": [c.to_dict() for c in verdict.cells],
        "reports": list(reports),
    }


def fleet_exit_code(document: Dict[str, Any]) -> int:
    """0 when nothing FAILed (WARN is fine), 1 otherwise, as for one node."""
    return 0 if document["summary"]["ok"] else 1


def save_fleet(document: Dict[str, Any], output_dir: Path) -> Tuple[Path, Path]:
    """``validate/fleet.json`` and ``validate/fleet.html`` in ``output_dir``, written atomically."""
    from torchscale.results.files import atomic_write_json, atomic_write_text, ensure_dir
    from torchscale.results.layout import FLEET_PAGE, FLEET_REPORT, VALIDATE_DIR
    from torchscale.validate.fleet_page import fleet_html

    folder = Path(output_dir) / VALIDATE_DIR
    ensure_dir(folder)
    report, page = folder / FLEET_REPORT, folder / FLEET_PAGE
    atomic_write_json(report, document)
    atomic_write_text(page, fleet_html(document))
    return report, page
