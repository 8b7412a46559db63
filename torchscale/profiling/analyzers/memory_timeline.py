"""Memory over time, from the allocator events a trace holds (torch.profiler's
``profile_memory=True`` writes one ``[memory]`` instant per allocation and free, with the
allocator's running totals). Traces without them give empty tables: nothing is guessed.

``memory_summary``: per rank and device, the peak allocated and reserved bytes and when the
allocation peaked (us from the rank's first memory event), the allocated bytes at the start and
end of the window and their difference (a steady loop ends where it began; a leak does not).
``memory_timeline``: per rank, device and time bucket, the largest allocated and reserved bytes,
for plotting.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.traces.model import RankTrace

DEVICE_TYPES = {0: "cpu", 1: "cuda"}  # torch's DeviceType numbers (others by number)
SUMMARY_COLUMNS = [
    "rank", "device", "events", "peak_allocated_bytes", "peak_at_us", "peak_reserved_bytes",
    "allocated_start_bytes", "allocated_end_bytes", "allocated_growth_bytes",
]  # fmt: skip
TIMELINE_COLUMNS = ["rank", "device", "bucket", "start_us", "allocated_bytes", "reserved_bytes"]


def _device(kind: float, number: float) -> str:
    name = DEVICE_TYPES.get(int(kind), f"device type {int(kind)}") if np.isfinite(kind) else "?"
    return name if name == "cpu" or not np.isfinite(number) else f"{name}:{int(number)}"


def _per_device(trace: RankTrace) -> List[Tuple[Any, ...]]:
    memory = trace.memory
    if memory.empty:
        return []
    keys = memory[["device_type", "device"]].drop_duplicates().to_numpy()
    out = []
    for kind, number in keys:
        same_kind = memory["device_type"].to_numpy() == kind
        mine = memory[same_kind & (memory["device"].to_numpy() == number)]
        if len(mine):  # a key of NaN matches no row (the reader leaves such events out)
            out.append((_device(kind, number), mine))
    return out


def memory_summary(traces: List[RankTrace]) -> pd.DataFrame:
    rows = []
    for trace in traces:
        for device, events in _per_device(trace):
            allocated = events["allocated"].to_numpy()
            peak = int(np.nanargmax(allocated)) if np.isfinite(allocated).any() else 0
            ts = events["ts"].to_numpy()
            rows.append(
                (
                    trace.rank,
                    device,
                    len(events),
                    float(np.nanmax(allocated)) if np.isfinite(allocated).any() else np.nan,
                    float(ts[peak] - ts[0]),
                    float(np.nanmax(events["reserved"].to_numpy()))
                    if events["reserved"].notna().any()
                    else np.nan,
                    float(allocated[0]),
                    float(allocated[-1]),
                    float(allocated[-1] - allocated[0]),
                )
            )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def memory_timeline(traces: List[RankTrace], buckets: int = 200) -> pd.DataFrame:
    frames = []
    for trace in traces:
        for device, events in _per_device(trace):
            ts = events["ts"].to_numpy()
            lo, hi = float(ts[0]), float(ts[-1])
            width = (hi - lo) / buckets if hi > lo else 1.0
            bucket = np.minimum(((ts - lo) // width).astype(np.int64), buckets - 1)
            frame = pd.DataFrame(
                {
                    "bucket": bucket,
                    "allocated_bytes": events["allocated"].to_numpy(),
                    "reserved_bytes": events["reserved"].to_numpy(),
                }
            )
            top = frame.groupby("bucket", as_index=False).max()
            top.insert(0, "device", device)
            top.insert(0, "rank", trace.rank)
            top.insert(3, "start_us", lo + top["bucket"] * width)
            frames.append(top[TIMELINE_COLUMNS])
    if not frames:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    return pd.concat(frames, ignore_index=True)
