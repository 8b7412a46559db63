"""Findings: bottlenecks with the evidence and what to change, from every source, in one table.

Sources: ``findings.json`` files written by ``torchscale profile`` (read defensively: only
``severity``, ``category``, ``title``/``message``, ``ranks`` and ``recommendation`` are relied on),
the sync warnings the worker puts in each training record, and scaling below the "good" band.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import pandas as pd

from torchscale.analysis.cpu_load import oversubscribed_wait
from torchscale.analysis.finding import Finding, Severity, severity_order, shown_severity
from torchscale.analysis.scaling import EFFICIENCY_GOOD
from torchscale.hardware.device_noun import device_noun, is_cpu, record_device_kind
from torchscale.measures.figures import SYNC_OVERHEAD
from torchscale.measures.straggler import PROFILE_NEXT, straggler_advice, sync_variance_advice
from torchscale.results.schema import ResultBase, TrainingResult

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


def busy_host_wait(records: Iterable[ResultBase]) -> Optional[float]:
    """Whether a busy host explains what ``records`` lost: the largest share of its window a
    rank waited for a CPU while other processes held the cores (``analysis.cpu_load``), or None.
    The one check tuning advice asks before it is given (a loss the host explains is no DDP
    setting's to fix)."""
    return oversubscribed_wait(records)


def busy_host_advice(share: float) -> str:
    """What to do instead of tuning, when a busy host explains the loss."""
    return (
        f"Not a DDP setting: a rank waited for a CPU {share:.0%} of its measured window while "
        "other processes held the cores (see the CPU-wait finding), so this loss is the busy "
        "host's. Rerun on a quiet node, or give each rank cores of its own (taskset/numactl, "
        "the scheduler's CPU binding), before tuning anything."
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
        "severity": shown_severity(str(doc.get("severity") or "info")),
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
            severity=Severity.MEDIUM,
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


def scaling_findings(
    table: pd.DataFrame, records: Iterable[ResultBase] = ()
) -> List[Dict[str, Any]]:
    """Per model: the configurations whose efficiency at their largest GPU count is below the
    "good" band, with the worst one's numbers. Its advice is tuning advice unless a busy host
    explains the loss (:func:`busy_host_wait` over the worst configuration's cells in
    ``records``, at both counts)."""
    by_id = {r.cell_id: r for r in records}
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
            config_key=("config_key", "first"),
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
        counts = {int(worst["world_size"]), int(worst["baseline"])}
        same = ok[
            (ok["experiment"] == experiment)
            & (ok["config_key"] == worst["config_key"])
            & ok["world_size"].isin(counts)
        ]
        busy = busy_host_wait(by_id[c] for c in same["cell_id"] if c in by_id)
        if busy is not None:
            advice = busy_host_advice(busy)
        elif not pd.isna(sync) and sync >= 10:
            advice = SYNC_BOUND_ADVICE
        else:
            advice = COMPUTE_BOUND_ADVICE
        finding = Finding(
            severity=Severity.HIGH if efficiency < 0.5 else Severity.MEDIUM,
            category="scaling",
            title=f"{model} scales below {EFFICIENCY_GOOD:.0%}{others}",
            message=f"Worst: {worst['variant']} at {efficiency:.0%} on "
            f"{device_noun(cpu, int(worst['world_size']))} against "
            f"{device_noun(cpu, int(worst['baseline']))}{detail}.",
            recommendation=advice,
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
    # One vocabulary on every surface, whoever wrote the finding (another tool's "critical").
    table["severity"] = table["severity"].map(lambda s: shown_severity(str(s)))
    same = ["experiment", "severity", "category", "title", "message", "recommendation"]
    table = table[~table[same].astype(str).duplicated()]
    order = table["severity"].map(severity_order)
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")
