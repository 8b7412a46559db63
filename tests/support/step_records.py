"""Training records whose every rank's step parts (input wait, no_sync step, sync wait) are
given, aggregated by the worker's own ``aggregate`` (for the lost-efficiency and diff tests)."""

from __future__ import annotations

from typing import List, Tuple

from tests.support.report_fixtures import _identity, _settings
from torchscale.measures.stats import time_stats
from torchscale.results.schema import RankResult, TrainingResult
from torchscale.worker.aggregate import aggregate

STEPS = 20
BATCH = 16


def rank_parts(rank: int, data: float, nosync: float, wait: float) -> dict:
    step = nosync + wait
    times = [step] * STEPS
    return {
        "rank": rank, "local_rank": rank, "host": "node-a", "device": f"cuda:{rank}",
        "step_time_ms": time_stats(times), "step_times_ms": times, "measure_steps": STEPS,
        "window_s": sum(times) / 1000, "data_ms": data, "forward_ms": (nosync - data) / 3,
        "backward_ms": 2 * (nosync - data) / 3 + wait, "optimizer_ms": 0.0,
        "nosync_step_ms": nosync, "sync_wait_ms": wait,
    }  # fmt: skip


def parts_record(parts: List[Tuple[float, float, float]]) -> TrainingResult:
    world = len(parts)
    figures = aggregate(
        [rank_parts(r, *p) for r, p in enumerate(parts)],
        batch_size=BATCH, grad_accum_steps=1, precision="bf16", unit="samples",
        units_per_sample=1.0, flops_per_sample=None, device_name=None,
    )  # fmt: skip
    identity = _identity(_settings("mlp", BATCH, world, 0), "scaling")
    return TrainingResult(**{**identity, **figures}, status="ok", backend="nccl", hosts=["node-a"])


def busy_host_ranks(record: TrainingResult) -> List[RankResult]:
    """``record``'s ranks as measured on a busy host: each waited for a CPU 40% of its window
    while other processes kept one more core of the host busy (what schedstat and /proc/stat
    record beside ranks that share their cores with a spinner)."""
    busy_cpu_s = sum(r.process_cpu_s or 0.0 for r in record.per_rank)
    return [
        rank.model_copy(
            update={
                "cpu_wait_s": 0.4 * rank.window_s,
                "host_busy_cpu_s": busy_cpu_s + rank.window_s,
            }
        )
        for rank in record.per_rank
    ]
