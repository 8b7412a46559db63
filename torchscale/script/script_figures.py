"""A script cell's figures: what one rank measured, and the cell's result from every rank's.

The same fields as the built-in worker's (``worker.measure.measure_rank``, ``worker.aggregate``):
per-step times of the measured window, phase means, the no_sync probe's compute-only step and
the sync wait it gives, DDP's own logging figures, memory, CPU accounting. Throughput is the
samples every rank trained on in the window over the slowest rank's window, as for a model; the
samples are counted (the batch dimension of each DDP forward), not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from torchscale.measures.stats import mean, time_stats
from torchscale.worker.aggregate import aggregate

SAMPLES_KEY = "samples"
"""A rank's samples over the measured window (beside its RankResult fields)."""


@dataclass
class RankWindows:
    """What one rank collected over its windows (durations in ms, from ``StepMarks``)."""

    measured: List[Dict[str, float]] = field(default_factory=list)
    window_s: float = 0.0
    samples: int = 0
    nosync: List[Dict[str, float]] = field(default_factory=list)
    ddp_timings: Dict[str, Optional[float]] = field(default_factory=dict)
    cpu: Dict[str, Optional[float]] = field(default_factory=dict)


def rank_figures(windows: RankWindows, place: Dict[str, Any]) -> Dict[str, Any]:
    """This rank's RankResult fields (``place``: rank, host, device, memory, gpu, timeline...)."""
    measured = windows.measured
    step_ms = [d["step"] for d in measured]
    nosync_ms = mean([d["step"] for d in windows.nosync])
    step_mean = mean(step_ms)
    # As the worker: per-step waits clipped at zero for their spread, the mean from the means.
    waits = [max(0.0, s - nosync_ms) for s in step_ms] if nosync_ms is not None else []
    mean_wait = (
        max(0.0, step_mean - nosync_ms) if nosync_ms is not None and step_mean is not None else None
    )
    return {
        **place,
        "measure_steps": len(step_ms),
        "window_s": windows.window_s,
        "step_time_ms": time_stats(step_ms),
        "step_times_ms": step_ms,
        "data_ms": mean([d["data"] for d in measured]),
        "forward_ms": mean([d["forward"] for d in measured]) or 0.0,
        "backward_ms": mean([d["backward"] for d in measured]) or 0.0,
        "optimizer_ms": mean([d["optimizer"] for d in measured]) or 0.0,
        "nosync_step_ms": nosync_ms,
        "sync_wait_ms": mean_wait,
        "sync_wait_samples_ms": waits,
        **windows.ddp_timings,
        **windows.cpu,
        SAMPLES_KEY: windows.samples,
    }


def cell_result(ranks: List[Dict[str, Any]], device_name: Optional[str]) -> Dict[str, Any]:
    """The TrainingResult measurement fields of a script cell from every rank's figures."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    steps = min(len(r["step_times_ms"]) for r in ranks)
    total = sum(int(r.get(SAMPLES_KEY) or 0) for r in ranks)
    per_step = total / steps if steps else 0.0  # the job's samples per step, every rank's
    per_rank = per_step / len(ranks)
    result = aggregate(
        ranks,
        batch_size=max(1, round(per_rank)),
        grad_accum_steps=1,
        precision="fp32",  # no peak is looked up: a script's FLOPs are not known
        unit="samples",
        units_per_sample=1.0,
        flops_per_sample=None,
        device_name=device_name,
    )
    window_s = result["measured_s"]
    samples_per_s = total / window_s if window_s > 0 and total > 0 else None
    result.update(
        samples_per_s=samples_per_s,
        throughput=samples_per_s,
        global_batch_size=max(1, round(per_step)),
        batch_size=max(1, round(per_rank)),
        peak_tflops=None,
        mfu=None,
    )
    return result
