"""CUDA kernel launches per rank: launch statistics and the launch queue over time.

Launch statistics follow HTA 0.5.0 (``get_cuda_kernel_launch_stats``): every GPU row launched by
``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cudaMemcpyAsync``, ``cudaMemsetAsync`` or MTIA's
``runFunction`` (we add HIP's equivalents, which HTA 0.5.0 leaves out) has a CPU duration (the
call), a GPU duration (the kernel) and a launch delay (kernel start - call end, clipped at 0).
Per rank: their distribution, the *short kernels* (GPU duration under the call's: launching
costs more than running), calls over ``runtime_cutoff_us`` and delays over
``launch_delay_cutoff_us``.

Queue length follows HTA's ``get_queue_length_summary``: on each stream the number of launched
but not yet started operations, +1 at each launching call, -1 when its GPU row starts; the
summary describes the values at those moments (count, mean, std, min, quartiles, max), and
``queue_timeline`` gives each stream's largest queue per time bucket, for plotting.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.traces.model import RankTrace

KERNEL_LAUNCHES = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync",
    "runFunction - job_prep_and_submit_for_execution",
)  # fmt: skip
HIP_LAUNCHES = (
    "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync",
    "hipMemcpyWithStream",
)  # fmt: skip
# HTA's queue counts these (its ``get_runtime_launch_events_query``)
QUEUE_LAUNCHES = (*KERNEL_LAUNCHES, "cuLaunchKernel", *HIP_LAUNCHES)
RUNTIME_CUTOFF_US = 50.0
LAUNCH_DELAY_CUTOFF_US = 100.0
QUANTILES = (0.5, 0.9, 0.99)
QUEUE_SUMMARY_COLUMNS = [
    "rank",
    "stream",
    "count",
    "mean",
    "std",
    "min",
    "p25",
    "p50",
    "p75",
    "max",
]


def launch_table(
    trace: RankTrace, calls: Tuple[str, ...] = (*KERNEL_LAUNCHES, *HIP_LAUNCHES)
) -> pd.DataFrame:
    """One row per launched GPU row: correlation, cpu_duration, gpu_duration, launch_delay (us)."""
    gpu = trace.gpu_events()
    mine = gpu[gpu["launcher"].isin(calls).to_numpy()]
    call_end = mine["launch_ts"].to_numpy() + mine["launch_dur"].to_numpy(dtype=np.float64)
    return pd.DataFrame(
        {
            "correlation": mine["correlation"].to_numpy(),
            "cpu_duration": mine["launch_dur"].to_numpy(dtype=np.float64),
            "gpu_duration": mine["dur"].to_numpy(dtype=np.float64),
            "launch_delay": np.clip(mine["ts"].to_numpy() - call_end, 0.0, None),
        }
    )


def _stats(prefix: str, values: np.ndarray) -> Dict[str, float]:
    if not len(values):
        return {f"{prefix}_{k}": np.nan for k in ("mean", "p50", "p90", "p99", "max")}
    q = np.quantile(values, QUANTILES)
    out = {f"{prefix}_mean": float(values.mean())}
    out.update({f"{prefix}_p{int(p * 100)}": float(v) for p, v in zip(QUANTILES, q)})
    out[f"{prefix}_max"] = float(values.max())
    return out


def launch_stats(
    traces: List[RankTrace],
    runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
    launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US,
) -> pd.DataFrame:
    """One row per rank: launches, CPU/GPU duration and launch delay statistics, shares."""
    rows = []
    for trace in traces:
        table = launch_table(trace)
        cpu, gpu = table["cpu_duration"].to_numpy(), table["gpu_duration"].to_numpy()
        delay = table["launch_delay"].to_numpy()
        n = len(table)
        row: Dict[str, Any] = {"rank": trace.rank, "launches": n}
        row.update(_stats("cpu_us", cpu) | _stats("gpu_us", gpu) | _stats("delay_us", delay))
        short = int((gpu < cpu).sum())
        row.update(
            {
                "short_kernels": short,
                "short_kernel_share": short / n if n else np.nan,
                "runtime_outliers": int((cpu > runtime_cutoff_us).sum()),
                "delay_outliers": int((delay > launch_delay_cutoff_us).sum()),
                "delay_sum_us": float(delay.sum()),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _queue_events(trace: RankTrace) -> pd.DataFrame:
    """ts, stream and +1/-1 of every queued launch and start, in time order per stream."""
    gpu = trace.gpu_events()
    mine = gpu[gpu["launcher"].isin(QUEUE_LAUNCHES).to_numpy()]
    stream = mine["stream"].to_numpy().astype(np.int64)
    calls = np.argsort(mine["launch_ts"].to_numpy(), kind="stable")  # calls in time order
    events = pd.DataFrame(
        {
            "ts": np.r_[mine["launch_ts"].to_numpy()[calls], mine["ts"].to_numpy()],
            "stream": np.r_[stream[calls], stream],
            "change": np.r_[np.ones(len(mine), np.int64), -np.ones(len(mine), np.int64)],
        }
    )
    # Calls, then starts, sorted as HTA sorts them (numpy's default sort: a call and a start at
    # the same microsecond fall as they fall there too; a stable sort moves the mean by ~1%).
    events = events.iloc[np.argsort(events["ts"].to_numpy(), kind="quicksort")]
    events = events.reset_index(drop=True)
    events["queue_length"] = events.groupby("stream")["change"].cumsum()
    return events


def queue_length_summary(traces: List[RankTrace]) -> pd.DataFrame:
    """Per rank and stream: HTA's description of the queue lengths seen."""
    frames = []
    for trace in traces:
        events = _queue_events(trace)
        if events.empty:
            continue
        stats = events.groupby("stream")["queue_length"].describe().reset_index()
        stats.columns = ["stream", "count", "mean", "std", "min", "p25", "p50", "p75", "max"]
        stats.insert(0, "rank", trace.rank)
        frames.append(stats)
    if not frames:
        return pd.DataFrame(columns=QUEUE_SUMMARY_COLUMNS)
    summary: pd.DataFrame = pd.concat(frames, ignore_index=True)[QUEUE_SUMMARY_COLUMNS]
    return summary


def queue_timeline(traces: List[RankTrace], buckets: int = 200) -> pd.DataFrame:
    """Per rank, stream and time bucket (of the rank's span): the largest queue length."""
    frames = []
    for trace in traces:
        events = _queue_events(trace)
        if events.empty:
            continue
        lo, hi = float(events["ts"].min()), float(events["ts"].max())
        width = (hi - lo) / buckets if hi > lo else 1.0
        events["bucket"] = np.minimum(((events["ts"] - lo) // width).astype(np.int64), buckets - 1)
        top = events.groupby(["stream", "bucket"])["queue_length"].max().reset_index()
        top["start_us"] = lo + top["bucket"] * width
        top.insert(0, "rank", trace.rank)
        frames.append(top[["rank", "stream", "bucket", "start_us", "queue_length"]])
    if not frames:
        return pd.DataFrame(columns=["rank", "stream", "bucket", "start_us", "queue_length"])
    return pd.concat(frames, ignore_index=True)
