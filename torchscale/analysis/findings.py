"""Findings: bottlenecks with the evidence and what to change, from every source, in one table.

Sources: ``findings.json`` files written by ``torchscale profile`` (read defensively: only
``severity``, ``category``, ``title``/``message``, ``ranks`` and ``recommendation`` are relied on),
the sync warnings the worker puts in each training record, and scaling below the "good" band.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import pandas as pd

from torchscale.analysis.finding import Finding, Severity, severity_order
from torchscale.analysis.scaling import EFFICIENCY_GOOD
from torchscale.hardware.device_noun import device_noun, is_cpu, record_device_kind
from torchscale.results.figures import SYNC_OVERHEAD
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.results.straggler import PROFILE_NEXT, straggler_advice, sync_variance_advice

COLUMNS = [
    "severity",
    "category",
    "title",
    "message",
    "ranks",
    "recommendation",
    "source",
    "experiment",
]


def on_cpu(record: ResultBase) -> bool:
    """Whether a record's ranks (any kind of cell) were CPU processes, or talked over gloo: no
    GPU interconnect advice fits it (what ran where: ``hardware.device_noun``)."""
    return getattr(record, "backend", None) == "gloo" or is_cpu(record_device_kind(record))


SYNC_BOUND_ADVICE = (
    "The sync overhead is high: overlap more of it (ddp.bucket_cap_mb, "
    "ddp.gradient_as_bucket_view, ddp.static_graph), raise the per-rank batch or use gradient "
    "accumulation, or compress gradients (ddp.comm_hook fp16/bf16/powersgd)."
)
COMPUTE_BOUND_ADVICE = (
    "Sync is not where time goes: compare per-rank step times for a straggler, check the "
    "input pipeline (data.num_workers, pinned memory) and profile the cell."
)


def _ranks(value: Any) -> List[int]:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, (int, float))]
    return [int(value)] if isinstance(value, (int, float)) else []


def normalize(doc: Mapping[str, Any], source: str, experiment: str = "") -> Dict[str, Any]:
    """A finding from any producer, with the fields the report shows; ``experiment`` names the
    experiment it was found in."""
    title = doc.get("title") or doc.get("message") or doc.get("category") or "finding"
    message = doc.get("message") if doc.get("title") else doc.get("detail")
    return {
        "severity": str(doc.get("severity") or "info").lower(),
        "category": str(doc.get("category") or "general"),
        "title": str(title),
        "message": str(message) if message else "",
        "ranks": _ranks(doc.get("ranks", doc.get("rank"))),
        "recommendation": str(doc.get("recommendation") or ""),
        "source": source,
        "experiment": str(doc.get("experiment") or experiment),
    }


def _cells(labels: List[str]) -> str:
    shown = ", ".join(labels[:4])
    return shown + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")


def record_findings(records: Iterable[ResultBase]) -> List[Dict[str, Any]]:
    """The sync warnings the worker recorded, one finding per model and straggler rank (or
    erratic sync), listing the cells where it was seen."""
    groups: Dict[Tuple[str, str, Optional[int]], List[TrainingResult]] = {}
    for record in records:
        if isinstance(record, TrainingResult) and record.sync and record.sync.warning:
            key = (record.experiment, record.model, record.sync.slowest_rank)
            groups.setdefault(key, []).append(record)
    found = []
    for (experiment, model, slowest), cells in groups.items():
        cells.sort(key=lambda r: (r.world_size, r.batch_size, r.repeat))
        worst = max(cells, key=lambda r: (r.sync.wait_spread_ms if r.sync else None) or 0.0)
        gpu = not all(on_cpu(r) for r in cells)
        labels = list(
            dict.fromkeys(
                f"batch {r.batch_size} on {device_noun(not gpu, r.world_size)}" for r in cells
            )
        )
        if slowest is not None:
            title = f"Rank {slowest} is a straggler"
            advice = straggler_advice(slowest, gpu, PROFILE_NEXT)
        else:
            title = "Erratic gradient sync"
            advice = sync_variance_advice(gpu, PROFILE_NEXT)
        finding = Finding(
            severity=Severity.WARNING,
            category="sync",
            title=f"{title}: {model}",
            message=f"Seen in {_cells(labels)}. {worst.sync.warning if worst.sync else ''}.",
            ranks=[slowest] if slowest is not None else [],
            recommendation=advice,
            source=worst.cell_id + (f" (+{len(cells) - 1} cells)" if len(cells) > 1 else ""),
            experiment=experiment,
        )
        found.append(finding.to_row())
    return found


def scaling_findings(table: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per model: the configurations whose efficiency at their largest GPU count is below the
    "good" band, with the worst one's numbers."""
    ok = table[(table["status"] == "ok") & table["scaling_efficiency"].notna()]
    ok = ok[ok["world_size"] > ok["baseline_world_size"]]
    if ok.empty:
        return []
    largest = ok.groupby(["experiment", "config_key"])["world_size"].transform("max")
    at_largest = (
        ok[ok["world_size"] == largest]
        .groupby(["experiment", "model", "variant", "world_size"], as_index=False, sort=False)
        .agg(
            efficiency=("scaling_efficiency", "mean"),
            sync=("sync_overhead_pct", "mean"),
            baseline=("baseline_world_size", "first"),
            cell_id=("cell_id", "first"),
            device=("device_name", "first"),
        )
    )
    found = []
    for (experiment, model), group in at_largest.groupby(["experiment", "model"], sort=True):
        below = group[group["efficiency"] <= EFFICIENCY_GOOD]
        if below.empty:
            continue
        worst = below.sort_values("efficiency", kind="stable").iloc[0]  # the first lowest
        efficiency, sync = float(worst["efficiency"]), worst["sync"]
        cpu = str(worst["device"]).lower() == "cpu"
        detail = f"; {SYNC_OVERHEAD.name} {sync:.0f}% of its step" if not pd.isna(sync) else ""
        others = f" ({len(below)} of {len(group)} configurations)" if len(group) > 1 else ""
        finding = Finding(
            severity=Severity.HIGH if efficiency < 0.5 else Severity.WARNING,
            category="scaling",
            title=f"{model} scales below {EFFICIENCY_GOOD:.0%}{others}",
            message=f"Worst: {worst['variant']} at {efficiency:.0%} on "
            f"{device_noun(cpu, int(worst['world_size']))} against "
            f"{device_noun(cpu, int(worst['baseline']))}{detail}.",
            recommendation=(
                SYNC_BOUND_ADVICE if not pd.isna(sync) and sync >= 10 else COMPUTE_BOUND_ADVICE
            ),
            source=str(worst["cell_id"]),
            experiment=str(experiment),
        )
        found.append(finding.to_row())
    return found


def findings_table(findings: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """All findings, most severe first; a finding made twice in one experiment (the same trace
    analysed twice, say) is listed once."""
    table = pd.DataFrame(list(findings), columns=COLUMNS)
    table["experiment"] = table["experiment"].fillna("")
    same = ["experiment", "severity", "category", "title", "message", "recommendation"]
    table = table[~table[same].astype(str).duplicated()]
    order = table["severity"].map(severity_order)
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")
