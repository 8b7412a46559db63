"""Rules that turn the analysis tables into findings: what is wrong, on which ranks and steps,
the numbers behind it, and what to do about it."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from torchscale.analysis.finding import Finding, Severity
from torchscale.measures.straggler import (
    RankWait,
    find_straggler,
    straggler_advice,
    sync_variance_advice,
)
from torchscale.measures.table_scalars import as_float

# --- thresholds (percentages are of step time unless said otherwise) -------------------------
# Who is a straggler: torchscale.measures.straggler, the one rule.
# Sync stall that no single rank explains (ranks take turns being late): report from 5%.
SYNC_STALL_PCT = 5.0
# Sync time varying by more than 25% (coefficient of variation) across ranks or steps, when
# sync is >= 5% of the step, is the "high variance in gradient sync time" of the user story.
SYNC_CV = 0.25
SYNC_SIGNIFICANT_PCT = 5.0
# Overlap: DDP overlaps all-reduce with backward; < 50% hidden means buckets start late.
LOW_OVERLAP_PCT = 50.0
COMM_SIGNIFICANT_PCT = 10.0  # ... when communication is >= 10% of GPU time at all
# Exposed communication >= 10% of GPU time is worth compressing or amortising.
EXPOSED_COMM_PCT = 10.0
# GPU idle >= 30% of its active span (HTA idle) points at a CPU-bound (launch-bound) loop.
GPU_IDLE_PCT = 30.0
# Waiting >= 10% of the step for the next batch means the input pipeline cannot keep up.
DATALOADER_PCT = 10.0
# Copies/memsets taking >= 10% of GPU busy time.
MEMORY_PCT = 10.0
HIGH, MEDIUM, LOW = Severity.HIGH, Severity.MEDIUM, Severity.LOW

TARGET_CATEGORIES = {
    "sync_stalls": {"straggler", "sync"},
    "communication": {"straggler", "sync", "communication"},
    "compute": {"compute", "data_loading"},
    "memory": {"memory"},
    "all": {"straggler", "sync", "communication", "compute", "data_loading", "memory"},
}
TARGETS = tuple(TARGET_CATEGORIES)


def _severity(value: float, medium: float, high: float) -> Severity:
    return HIGH if value >= high else MEDIUM if value >= medium else LOW


def _num(value: object, digits: int = 2) -> Optional[float]:
    return (
        None
        if value is None or (isinstance(value, float) and np.isnan(value))
        else round(as_float(value), digits)
    )


def _by_rank(rows: pd.DataFrame, column: str, digits: int = 2) -> Dict[int, Optional[float]]:
    """Evidence: ``column`` for each rank in ``rows``."""
    return {int(r): _num(v, digits) for r, v in zip(rows["rank"], rows[column])}


def _device(rank: int, instances: pd.DataFrame) -> str:
    return f"GPU-{rank}" if (instances["device"] == "gpu").all() else f"rank {rank}"


def straggler_findings(ranks: pd.DataFrame, instances: pd.DataFrame) -> List[Finding]:
    columns = ("rank", "sync_stall_pct", "caused_wait_share", "significant_instances")
    figures = [
        RankWait(int(rank), float(stall), float(caused), int(np.nan_to_num(significant)))
        for rank, stall, caused, significant in zip(
            *(ranks[c].to_numpy(dtype=float) for c in columns)
        )
    ]
    verdict = find_straggler(figures, step=100.0)  # stalls are percentages of each rank's step
    if verdict is None:
        return []
    late = verdict.rank
    row: Dict[Any, Any] = ranks[ranks["rank"] == late].to_dict("records")[0]
    others = ranks[ranks["rank"] != late]
    stall = float(others["sync_stall_pct"].mean())
    mine = instances[(instances["rank"] == late) & instances["is_last"]]
    op = str(mine["op"].mode().iloc[0]) if len(mine) else "collective"
    nccl = "NCCL " if (mine["device"] == "gpu").all() else "gloo "
    early = others.sort_values("sync_stall_pct", ascending=False)["rank"].iloc[0]
    who, other = _device(late, instances), _device(int(early), instances)
    finding = Finding(
        severity=_severity(stall, 5.0, 10.0),
        category="straggler",
        title=(
            f"{nccl}{op}: {who} arrives last at {row['times_last']} of "
            f"{row['significant_instances']} collectives, causing "
            f"{row['caused_wait_share']:.0%} of all waiting (finishes its compute later "
            f"than {other}); the other ranks wait {stall:.1f}% of step time for it"
        ),
        recommendation=straggler_advice(late, gpu=nccl == "NCCL "),
        ranks=[late],
        steps=sorted({int(s) for s in mine["step"] if s >= 0}),
        evidence={
            "times_last": int(row["times_last"]),
            "significant_instances": int(row["significant_instances"]),
            "last_share": _num(row["last_share"], 3),
            "caused_wait_share": _num(row["caused_wait_share"], 3),
            "others_sync_stall_pct": _num(stall),
            "others_wait_us": _num(float(others["wait_us"].sum()), 1),
        },
    )
    return [finding]


def sync_findings(ranks: pd.DataFrame, have_straggler: bool, gpu: bool = True) -> List[Finding]:
    out = []
    stall = float(ranks["sync_stall_pct"].mean()) if len(ranks) else float("nan")
    if not have_straggler and stall >= SYNC_STALL_PCT:
        out.append(
            Finding(
                severity=_severity(stall, 10.0, 20.0),
                category="sync",
                title=(
                    f"Ranks wait {stall:.1f}% of step time in collectives, with no single straggler"
                ),
                recommendation=(
                    "Ranks take turns arriving late: look for uneven work per rank "
                    "(variable sequence lengths or batch sizes; bucket by length), "
                    "and for noisy neighbours on the hosts (CPU pinning, other jobs)."
                ),
                ranks=[int(r) for r in ranks["rank"]],
                evidence={"sync_stall_pct": _num(stall)},
            )
        )
    mean = ranks["sync_time_mean_us"].to_numpy(dtype=float)
    step = ranks["step_mean_us"].to_numpy(dtype=float)
    # One rank, or no collectives: no means to average (np.nanmean would warn on all-NaN input).
    measured = np.isfinite(step).any() and np.isfinite(mean).any()
    share = 100.0 * np.nanmean(mean) / np.nanmean(step) if measured else float("nan")
    across_ranks = float(np.nanstd(mean) / np.nanmean(mean)) if np.isfinite(mean).sum() > 1 else 0.0
    across_steps = (
        float(np.nanmax(ranks["sync_time_cv"].to_numpy(dtype=float)))
        if np.isfinite(ranks["sync_time_cv"].to_numpy(dtype=float)).any()
        else 0.0
    )
    if share >= SYNC_SIGNIFICANT_PCT and max(across_ranks, across_steps) >= SYNC_CV:
        out.append(
            Finding(
                severity=MEDIUM,
                category="sync",
                title=(
                    f"Gradient synchronization: high variance in sync time (cv {across_ranks:.2f} "
                    f"across ranks, up to {across_steps:.2f} across steps)"
                ),
                recommendation=sync_variance_advice(gpu),
                ranks=[int(r) for r in ranks["rank"]],
                evidence={
                    "cv_across_ranks": _num(across_ranks, 3),
                    "cv_across_steps": _num(across_steps, 3),
                    "sync_share_of_step_pct": _num(share),
                },
            )
        )
    return out


def communication_findings(ranks: pd.DataFrame) -> List[Finding]:
    out = []
    comm_share = 100.0 * ranks["comm_time_us"] / ranks["kernel_time_us"]
    low = ranks[(ranks["overlap_pct"] < LOW_OVERLAP_PCT) & (comm_share >= COMM_SIGNIFICANT_PCT)]
    if len(low):
        worst = float(low["overlap_pct"].min())
        out.append(
            Finding(
                severity=_severity(LOW_OVERLAP_PCT - worst, 10.0, 30.0),
                category="communication",
                title=f"Only {worst:.1f}% of communication overlaps computation",
                recommendation=(
                    "Let DDP start all-reduces earlier during backward: tune "
                    "`bucket_cap_mb` (try 10-25 for earlier buckets, 50-100 for fewer "
                    "calls), pass `gradient_as_bucket_view=True`, `static_graph=True` when "
                    "the graph does not change, and avoid `find_unused_parameters=True`."
                ),
                ranks=[int(r) for r in low["rank"]],
                evidence={
                    "overlap_pct": _by_rank(low, "overlap_pct"),
                    "comm_share_of_gpu_time_pct": _num(float(comm_share[low.index].mean())),
                },
            )
        )
    exposed = 100.0 * ranks["exposed_comm_us"] / ranks["kernel_time_us"]
    big = ranks[exposed >= EXPOSED_COMM_PCT]
    if len(big):
        worst = float(exposed[big.index].max())
        out.append(
            Finding(
                severity=_severity(worst, 15.0, 25.0),
                category="communication",
                title=f"Exposed communication takes {worst:.1f}% of GPU time",
                recommendation=(
                    "Send less or less often: a DDP comm hook that compresses gradients "
                    "(`register_comm_hook(None, default_hooks.bf16_compress_hook)` or "
                    "fp16; PowerSGD for large models), a bigger per-GPU batch, or gradient "
                    "accumulation with `no_sync()` so that you synchronise every N steps."
                ),
                ranks=[int(r) for r in big["rank"]],
                evidence={
                    "exposed_comm_us": _by_rank(big, "exposed_comm_us", 1),
                    "exposed_share_of_gpu_time_pct": _num(worst),
                },
            )
        )
    return out


def _rank_threshold(
    ranks: pd.DataFrame,
    column: str,
    threshold: float,
    severity_at: Tuple[float, float],
    category: str,
    title: str,
    recommendation: str,
) -> List[Finding]:
    """One finding naming every rank whose ``column`` is at or above ``threshold``; ``title``
    is formatted with ``worst``, the highest value."""
    hit = ranks[ranks[column] >= threshold]
    if not len(hit):
        return []
    worst = float(hit[column].max())
    return [
        Finding(
            severity=_severity(worst, *severity_at),
            category=category,
            title=title.format(worst=worst),
            recommendation=recommendation,
            ranks=[int(r) for r in hit["rank"]],
            evidence={column: _by_rank(hit, column)},
        )
    ]


def compute_findings(ranks: pd.DataFrame) -> List[Finding]:
    return _rank_threshold(
        ranks,
        "idle_pct",
        GPU_IDLE_PCT,
        (40.0, 60.0),
        "compute",
        "GPU idle between kernels {worst:.1f}% of the time (CPU cannot launch fast enough)",
        "The loop is launch-bound: capture it with CUDA graphs or "
        '`torch.compile(mode="reduce-overhead")`, use a bigger batch per GPU, '
        "and remove host syncs (`.item()`, `.cpu()`, printing tensors).",
    ) + _rank_threshold(
        ranks,
        "dataloader_pct",
        DATALOADER_PCT,
        (20.0, 40.0),
        "data_loading",
        "Waiting for the next batch takes {worst:.1f}% of step time",
        "Feed the GPU faster: more DataLoader `num_workers`, `pin_memory=True`, "
        "`persistent_workers=True`, a larger `prefetch_factor`, and data on local disk.",
    )


def memory_findings(ranks: pd.DataFrame) -> List[Finding]:
    return _rank_threshold(
        ranks,
        "memory_pct",
        MEMORY_PCT,
        (20.0, 40.0),
        "memory",
        "Memory copies and sets take {worst:.1f}% of GPU busy time",
        "Copy less and asynchronously: pinned host memory with "
        "`.to(device, non_blocking=True)`, keep tensors on the GPU between steps, "
        "avoid moving results to the host every step.",
    )


def _on_gpus(ranks: pd.DataFrame, instances: pd.DataFrame) -> bool:
    """Whether the traced run used GPUs (NCCL), not CPU processes (gloo)."""
    if len(instances):
        return bool((instances["device"] == "gpu").all())
    kernels = ranks["kernel_time_us"] if "kernel_time_us" in ranks else pd.Series(dtype=float)
    return bool((kernels.fillna(0) > 0).any())


def find_bottlenecks(
    ranks: pd.DataFrame, instances: pd.DataFrame, target: str = "all"
) -> List[Finding]:
    """All findings for ``target``, most severe first."""
    wanted = TARGET_CATEGORIES[target]
    stragglers = straggler_findings(ranks, instances) if len(instances) else []
    found = (
        stragglers
        + sync_findings(ranks, bool(stragglers), gpu=_on_gpus(ranks, instances))
        + communication_findings(ranks)
        + compute_findings(ranks)
        + memory_findings(ranks)
    )
    found = [f for f in found if f.category in wanted]
    return sorted(found, key=lambda f: f.severity.rank)
