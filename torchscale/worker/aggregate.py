"""Combine every rank's measurements into the cell's figures (pure Python, no torch).

Throughput is samples over the slowest rank's measured wall window; a step's time is the slowest
rank's time for that step (DDP steps finish together, so this is the job's step).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from torchscale.hardware.peaks import mfu, peak_tflops
from torchscale.measures.stats import coefficient_of_variation, mean, time_stats
from torchscale.measures.straggler import RankWait, find_straggler

HIGH_WAIT_CV = 0.5
"""Coefficient of variation of per-step sync wait above which sync time is called erratic ..."""
MIN_WAIT_SHARE = 0.05
"""... provided the wait is at least this share of the step (else the noise is harmless)."""


def _place(ranks: List[Dict[str, Any]], rank: int) -> str:
    """`` (on node-3, GPU 5)``: where a rank ran, as its own figures say (empty if unknown)."""
    for row in ranks:
        if row.get("rank") == rank and row.get("host"):
            device = str(row.get("device") or "")
            what = "GPU" if device.startswith("cuda") else "CPU process"
            return f" (on {row['host']}, {what} {row.get('local_rank', '?')})"
    return ""


def sync_stats(ranks: List[Dict[str, Any]], step_ms: float) -> Optional[Dict[str, Any]]:
    """Exposed gradient-sync time, per-rank waits, and the straggler if there is one."""
    waits = [r.get("sync_wait_ms") for r in ranks]
    overheads = [
        1.0 - r["nosync_step_ms"] / r["step_time_ms"]["mean"]
        for r in ranks
        if r.get("nosync_step_ms") is not None and r["step_time_ms"]["mean"] > 0
    ]
    known: List[float] = [w for w in waits if w is not None]
    if not known:
        return None
    cvs = [coefficient_of_variation(r.get("sync_wait_samples_ms") or []) for r in ranks]
    cv_steps: Optional[float] = max((cv for cv in cvs if cv is not None), default=None)
    spread = max(known) - min(known)
    straggler = find_straggler([RankWait(r["rank"], r.get("sync_wait_ms")) for r in ranks], step_ms)
    slowest = straggler.rank if straggler else None
    # One rank has no peer to wait for: what looks like sync time there is noise.
    erratic = (
        len(ranks) > 1
        and cv_steps is not None
        and cv_steps > HIGH_WAIT_CV
        and (mean(known) or 0.0) > MIN_WAIT_SHARE * step_ms  # known is not empty: a float
    )
    warning = None
    if slowest is not None:
        warning = (
            f"High variance in gradient sync time detected: rank {slowest} is the straggler"
            f"{_place(ranks, slowest)}; "
            f"other ranks wait up to {spread:.1f} ms/step for it "
            f"({spread / step_ms:.0%} of the step)"
        )
    elif erratic:
        warning = (
            f"High variance in gradient sync time detected: sync wait varies {cv_steps:.0%} "
            "from step to step"
        )
    return {
        "exposed_fraction": max(0.0, mean(overheads) or 0.0) if overheads else None,
        "per_rank_wait_ms": waits,
        "wait_cv_across_steps": cv_steps,
        "wait_spread_ms": spread,
        "slowest_rank": slowest,
        "high_variance": warning is not None,
        "warning": warning,
    }


def mean_loss(ranks: List[Dict[str, Any]]) -> Optional[Any]:
    """The ranks' mean last loss; a non-finite one (``"NaN"`` as the worker writes it) wins: one
    diverged rank is a diverged model. None when a rank has none."""
    losses = [r.get("last_loss") for r in ranks]
    if not losses or any(loss is None for loss in losses):
        return None
    numbers = [float(loss) for loss in losses if loss is not None]  # float("NaN") is nan
    odd = [loss for loss, number in zip(losses, numbers) if not math.isfinite(number)]
    return odd[0] if odd else sum(numbers) / len(numbers)


def epoch_stats(
    ranks: List[Dict[str, Any]], global_batch: int, units_per_sample: float
) -> List[Dict[str, Any]]:
    """Per measured epoch: its steps, samples and the slowest rank's wall time, so its
    throughput; its step times (each the slowest rank's), from the ranks' consecutive steps."""
    passes = min((len(r.get("epochs") or []) for r in ranks), default=0)
    found, offset = [], 0
    for index in range(passes):
        steps = min(r["epochs"][index]["steps"] for r in ranks)
        window_s = max(r["epochs"][index]["window_s"] for r in ranks)
        per_step = [max(r["step_times_ms"][offset + i] for r in ranks) for i in range(steps)]
        offset += steps
        samples = global_batch * steps
        rate = samples / window_s if window_s > 0 else None
        found.append(
            {
                "epoch": index + 1,
                "steps": steps,
                "samples": samples,
                "window_s": window_s,
                "samples_per_s": rate,
                "throughput": rate * units_per_sample if rate else None,
                "step_time_ms": time_stats(per_step),
            }
        )
    return found


def combine_checks(per_rank: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The record's ``gradient_check`` from every rank's: failed when any rank failed (the first
    failing rank's cause); its cost the slowest rank's."""
    failed = [r for r in per_rank if not r.get("passed", True)]
    skipped = next((r["skipped"] for r in per_rank if r.get("skipped")), None)
    errors = [r["relative_error"] for r in per_rank if r.get("relative_error") is not None]
    costs = [r["check_s"] for r in per_rank if r.get("check_s") is not None]
    return {
        "passed": not failed,
        "cause": failed[0]["cause"] if failed else None,
        "skipped": skipped,
        "relative_error": max(errors) if errors else None,
        "tolerance": per_rank[0].get("tolerance") if per_rank else None,
        "shares": per_rank[0].get("shares") if per_rank else None,
        "check_s": max(costs) if costs else None,
    }


def aggregate(
    ranks: List[Dict[str, Any]],
    *,
    batch_size: int,
    grad_accum_steps: int,
    precision: str,
    unit: str,
    units_per_sample: float,
    flops_per_sample: Optional[float],
    device_name: Optional[str],
) -> Dict[str, Any]:
    """The TrainingResult measurement fields for one cell from its per-rank dicts."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    world = len(ranks)
    steps = min(len(r["step_times_ms"]) for r in ranks)
    per_step = [max(r["step_times_ms"][i] for r in ranks) for i in range(steps)]
    window_s = max(r["window_s"] for r in ranks)
    global_batch = world * batch_size * grad_accum_steps
    samples_per_s = global_batch * steps / window_s if window_s > 0 else None
    stats = time_stats(per_step)
    peak = peak_tflops(device_name, precision) if device_name and device_name != "cpu" else None
    per_device = samples_per_s / world if samples_per_s else None
    tflops = flops_per_sample * per_device / 1e12 if flops_per_sample and per_device else None
    memory = max(
        (r["memory"] for r in ranks if r.get("memory")),
        key=lambda m: m["peak_bytes"],
        default=None,
    )
    return {
        "global_batch_size": global_batch,
        "unit": unit,
        "units_per_sample": units_per_sample,
        "samples_per_s": samples_per_s,
        "throughput": samples_per_s * units_per_sample if samples_per_s else None,
        "step_time_ms": stats,
        "step_times_ms": per_step,
        "measure_steps": steps,
        "measured_s": window_s,
        "epochs": epoch_stats(ranks, global_batch, units_per_sample),
        "per_rank": ranks,
        "sync": sync_stats(ranks, stats["mean"] if stats else 0.0),
        "memory": memory,
        "last_loss": mean_loss(ranks),
        "gradient_check": (
            combine_checks([r["gradient_check"] for r in ranks if r.get("gradient_check")])
            if any(r.get("gradient_check") for r in ranks)
            else None
        ),
        "collectives": ranks[0].get("collectives") or [],  # rank 0's: every rank issues the same
        "flops_per_sample": flops_per_sample,
        "tflops_per_gpu": tflops,
        "peak_tflops": peak,
        "mfu": mfu(flops_per_sample or 0.0, per_device or 0.0, peak),
        "device_name": device_name,
    }
