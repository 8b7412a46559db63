"""CUDA kernel launches per rank: launch statistics and the launch queue over time.

Launch statistics follow HTA 0.5.0 (``get_cuda_kernel_launch_stats``): every GPU row launched by
``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cudaMemcpyAsync``, ``cudaMemsetAsync`` or MTIA's
``runFunction`` (we add HIP's equivalents, which HTA 0.5.0 leaves out) has a CPU duration (the
call), a GPU duration (the kernel) and a launch delay (kernel start - call end, clipped at 0).
Per rank: their distribution, the *short kernels* (GPU duration under the call's: launching
costs more than running), calls over ``runtime_cutoff_us`` and delays over
``launch_delay_cutoff_us``.

Queue length follows HTA's ``get_queue_length_summary``: on each stream the number of launched
but not yet started operations, +1 at each launching call, -1 when its GPU row starts, at ties in
HTA's order (``_queue_events``); the summary describes the values at those moments (count,
mean, std, min, quartiles, max), and ``queue_timeline`` gives each stream's largest queue per
time bucket, for plotting.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers.intervals import CHUNK_ROWS
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
    out = {f"{prefix}_mean": float(values.mean(dtype=np.float64))}
    out.update({f"{prefix}_p{int(p * 100)}": float(v) for p, v in zip(QUANTILES, q)})
    out[f"{prefix}_max"] = float(values.max())
    return out


def _launch_columns(trace: RankTrace) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CPU duration, GPU duration and launch delay of each launched GPU row, in float32 (what
    the statistics need; a large trace holds millions)."""
    gpu = trace.gpu_events()
    mine = gpu["launcher"].isin((*KERNEL_LAUNCHES, *HIP_LAUNCHES)).to_numpy()
    cpu = gpu["launch_dur"].to_numpy()[mine].astype(np.float32)
    run = gpu["dur"].to_numpy()[mine].astype(np.float32)
    delay = np.empty(len(cpu), dtype=np.float32)
    starts, calls = gpu["ts"].to_numpy(), gpu["launch_ts"].to_numpy()
    rows = np.flatnonzero(mine)
    for lo in range(0, len(rows), CHUNK_ROWS):
        at = rows[lo : lo + CHUNK_ROWS]
        gap = starts[at] - calls[at] - cpu[lo : lo + CHUNK_ROWS]
        delay[lo : lo + CHUNK_ROWS] = np.clip(gap, 0.0, None)
    return cpu, run, delay


def launch_stats(
    traces: List[RankTrace],
    runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
    launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US,
) -> pd.DataFrame:
    """One row per rank: launches, CPU/GPU duration and launch delay statistics, shares."""
    rows = []
    for trace in traces:
        cpu, gpu, delay = _launch_columns(trace)
        n = len(cpu)
        row: Dict[str, Any] = {"rank": trace.rank, "launches": n}
        row.update(_stats("cpu_us", cpu) | _stats("gpu_us", gpu) | _stats("delay_us", delay))
        short = int((gpu < cpu).sum())
        row.update(
            {
                "short_kernels": short,
                "short_kernel_share": short / n if n else np.nan,
                "runtime_outliers": int((cpu > runtime_cutoff_us).sum()),
                "delay_outliers": int((delay > launch_delay_cutoff_us).sum()),
                "delay_sum_us": float(delay.sum(dtype=np.float64)),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _queue_events(trace: RankTrace) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every launching call and every start of the rank in HTA's order: their moments (sorted),
    streams, and which are calls (a call raises its stream's queue, a start lowers it).

    HTA 0.5.0 puts the launching calls, then the GPU rows, one after the other and sorts the
    lot by time with numpy's (unstable) quicksort; where a call and a start of one stream fall in
    the same microsecond, that sort decides which counts first, and so the queue lengths seen.
    The same sort is run here on the same values, calls then starts, each part in time order
    (HTA's is the file's order, which the reader does not keep). With HTA's numpy on the same CPU
    (numpy's order of ties depends on the vector instructions it uses) this gives HTA's figures
    on the four reference traces exactly, but on one stream of nccl-16rank whose file is not in
    time order (mean 0.09% off); tests/test_trace_analyses.py says how close elsewhere. Memory:
    the moments and the sort's order, 32 bytes a launch, while it runs."""
    gpu = trace.gpu_events()
    rows = np.flatnonzero(gpu["launcher"].isin(QUEUE_LAUNCHES).to_numpy())
    n = len(rows)
    streams = gpu["stream"].to_numpy()[rows]
    calls = gpu["launch_ts"].to_numpy()[rows]
    by_call = np.lexsort((gpu["correlation"].to_numpy()[rows], calls))
    moments = np.empty(2 * n)
    moments[:n], moments[n:] = calls[by_call], gpu["ts"].to_numpy()[rows]
    stream_of = np.concatenate([streams[by_call], streams])
    del rows, streams, calls, by_call
    order = np.argsort(moments, kind="quicksort")
    moments.sort(kind="quicksort")  # ties are equal values: the array that order gives
    is_call = np.empty(2 * n, dtype=bool)
    sorted_streams = np.empty_like(stream_of)
    for lo in range(0, 2 * n, CHUNK_ROWS):
        part = order[lo : lo + CHUNK_ROWS]
        is_call[lo : lo + CHUNK_ROWS] = part < n  # the calls are the first half
        sorted_streams[lo : lo + CHUNK_ROWS] = stream_of[part]
    return moments, sorted_streams, is_call


def _stream_queues(
    streams: np.ndarray, is_call: np.ndarray
) -> Iterator[Tuple[int, np.ndarray, np.ndarray]]:
    """Per stream (of :func:`_queue_events`): its rows, and the queue length after each."""
    for stream in np.unique(streams):
        mine = streams == stream
        change = is_call[mine].astype(np.int8) * np.int8(2) - np.int8(1)  # +1 call, -1 start
        yield int(stream), mine, np.cumsum(change, dtype=np.int32)


def _quantile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """numpy's (linear) quantile of the sample that ``counts`` times each of ``values`` makes."""
    position = (counts.sum() - 1) * q
    below, frac = int(np.floor(position)), position - np.floor(position)
    cumulative = np.cumsum(counts)
    low = values[np.searchsorted(cumulative, below, side="right")]
    high = values[np.searchsorted(cumulative, min(below + 1, cumulative[-1] - 1), side="right")]
    return float(low + frac * (high - low))


def _summary_row(rank: int, stream: int, queue: np.ndarray) -> Tuple[Any, ...]:
    """HTA's description of one stream's queue lengths (pandas' describe: sample std, linearly
    interpolated quartiles), from a histogram of them."""
    low = int(queue.min())
    histogram = np.bincount(queue - low)
    seen = np.flatnonzero(histogram)
    values, counts = (seen + low).astype(np.float64), histogram[seen].astype(np.float64)
    n = counts.sum()
    mean = float((values * counts).sum() / n)
    var = float((counts * (values - mean) ** 2).sum() / (n - 1)) if n > 1 else np.nan
    quartiles = [_quantile(values, counts, q) for q in (0.25, 0.5, 0.75)]
    head = (rank, stream, float(n), mean, float(np.sqrt(var)), float(values[0]))
    return (*head, *quartiles, float(values[-1]))


TIMELINE_COLUMNS = ["rank", "stream", "bucket", "start_us", "queue_length"]


def queue_tables(traces: List[RankTrace], buckets: int = 200) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`queue_length_summary` and :func:`queue_timeline` of the same traces, each rank's
    launches sorted once for both."""
    rows, frames = [], []
    for trace in traces:
        moments, streams, is_call = _queue_events(trace)
        if not len(moments):
            continue
        gpu = trace.gpu_events()
        lo, hi = float(gpu["ts"].iloc[0]), float(gpu["ts"].iloc[-1])
        width = (hi - lo) / buckets if hi > lo else 1.0
        bucket = np.clip((moments - lo) // width, 0, buckets - 1).astype(np.int32)
        del moments
        for stream, mine, queue in _stream_queues(streams, is_call):
            rows.append(_summary_row(trace.rank, stream, queue))
            # in time order, so each bucket's moments are one run: the largest per run
            where = bucket[mine]
            first = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
            seen = where[first]
            frames.append(
                pd.DataFrame(
                    {
                        "rank": trace.rank,
                        "stream": stream,
                        "bucket": seen.astype(np.int64),
                        "start_us": lo + seen * width,
                        "queue_length": np.maximum.reduceat(queue, first).astype(np.int64),
                    }
                )
            )
    summary = pd.DataFrame(rows, columns=QUEUE_SUMMARY_COLUMNS)
    if not frames:
        return summary, pd.DataFrame(columns=TIMELINE_COLUMNS)
    return summary, pd.concat(frames, ignore_index=True)


def queue_length_summary(traces: List[RankTrace]) -> pd.DataFrame:
    """Per rank and stream: HTA's description of the queue lengths seen (count, mean, sample
    std, min, linearly interpolated quartiles, max)."""
    return queue_tables(traces)[0]


def queue_timeline(traces: List[RankTrace], buckets: int = 200) -> pd.DataFrame:
    """Per rank, stream and time bucket (of the rank's GPU span): the largest queue."""
    return queue_tables(traces, buckets)[1]
