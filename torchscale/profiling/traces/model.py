"""The one in-memory shape of a rank's trace, whatever file it came from.

Every reader produces two compact tables of the same columns, one for GPU activity (rows with a
stream: kernels, copies, sets) and one for the host (CPU ops, annotations, NVTX ranges), each
sorted by start time (times in microseconds, like Kineto and HTA):

=========== ========= ============================================================================
column      dtype     meaning
=========== ========= ============================================================================
ts          float64   start time (us)
dur         float32/  duration (us); float32 when every duration is exact in it (whole
            float64   microseconds below 16.7 s), else float64
cat         category  Kineto category: kernel, gpu_memcpy, gpu_memset, cuda_runtime, cpu_op,
                      user_annotation, ... (nsys rows are mapped onto the same names)
name        category  kernel / operator / range name (interned once per distinct string)
pid, tid    int       process and thread; for GPU rows Kineto uses the device and the stream
stream      int       CUDA stream, -1 for CPU rows
correlation int       CUDA correlation id linking a launch (CPU) and its kernel (GPU), -1 if none
launch_ts   float     for GPU rows, the start of the CPU call that launched it (NaN if unknown)
=========== ========= ============================================================================

Integer columns take the smallest type that holds their values (a stream id needs one byte, a
correlation id four): memory is what bounds the largest trace that can be analysed (issue 32:
about 40 bytes an event kept, nothing per event dropped). CUDA API calls (``cuda_runtime`` /
``cuda_driver``) only serve to find ``launch_ts`` and are not kept: they are as many as the
kernels and nothing else reads them.

Events that cannot be placed on a timeline (a negative duration, no or a non-finite start or
duration) are *invalid*: they are counted (``RankTrace.invalid``), reported and left out of every
figure, never silently dropped. The order of events in the file does not matter: both tables are
sorted on load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

EVENT_COLUMNS = ("ts", "dur", "cat", "name", "pid", "tid", "stream", "correlation", "launch_ts")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Why an event is invalid, in the order reported.
NEGATIVE_DURATION = "negative duration"
BAD_DURATION = "no or non-finite duration"
BAD_START = "no or non-finite start"
INVALID_REASONS = (NEGATIVE_DURATION, BAD_DURATION, BAD_START)


@dataclass
class RankTrace:
    """One rank's events (GPU and host tables) plus what the file said about itself."""

    rank: int
    path: Path
    source: str  # "kineto" or "nsys"
    gpu: pd.DataFrame
    cpu: pd.DataFrame
    metadata: Dict[str, object] = field(default_factory=dict)
    # Kineto only: HTA drops everything launched at or after the start of the last ProfilerStep
    # (that step is usually cut short by the profiler stopping). None: the whole trace counts.
    window_end: Optional[float] = None
    # Invalid events left out, by reason (see INVALID_REASONS); empty when there were none.
    invalid: Dict[str, int] = field(default_factory=dict)

    def gpu_events(self) -> pd.DataFrame:
        """GPU activity as HTA counts it: every row with a stream (kernels, memcpy, memset)."""
        return self.gpu

    def cpu_events(self) -> pd.DataFrame:
        return self.cpu

    @property
    def events(self) -> pd.DataFrame:
        """Both tables as one, sorted by start (a copy: for tests and small traces)."""
        both = pd.concat([self.gpu, self.cpu], ignore_index=True)
        return both.sort_values("ts", kind="stable", ignore_index=True)

    @property
    def event_count(self) -> int:
        return len(self.gpu) + len(self.cpu)

    def span_us(self) -> float:
        """From the first start to the last end of any kept event (NaN without events)."""
        starts = [float(t["ts"].iloc[0]) for t in (self.gpu, self.cpu) if len(t)]
        ends = [float((t["ts"] + t["dur"]).max()) for t in (self.gpu, self.cpu) if len(t)]
        return max(ends) - min(starts) if starts else float("nan")


def _codes(codes: np.ndarray) -> np.ndarray[Tuple[int], np.dtype[np.int32]]:
    return np.asarray(codes, dtype=np.int32).reshape(-1)  # 1-D already: says so to the checker


_INT_TYPES = (np.int8, np.int16, np.int32, np.int64)


def compact_ints(values: Any) -> np.ndarray:
    """Integers in the smallest signed type that holds them all."""
    array = np.asarray(values)
    if not len(array):
        return array.astype(np.int8)
    lo, hi = int(array.min()), int(array.max())
    for kind in _INT_TYPES:
        info = np.iinfo(kind)
        if info.min <= lo and hi <= info.max:
            return array.astype(kind, copy=False)
    return array.astype(np.int64, copy=False)  # pragma: no cover - int64 holds any int64


def compact_floats(values: Any) -> np.ndarray:
    """float32 when every value survives the round trip exactly (NaN included), else float64."""
    if isinstance(values, np.ndarray) and values.dtype == np.float32:
        return values
    array = np.asarray(values, dtype=np.float64)
    narrow = array.astype(np.float32)
    if np.array_equal(narrow, array, equal_nan=True):
        return narrow
    return array


def invalid_rows(ts: np.ndarray, dur: np.ndarray) -> Tuple[np.ndarray, Dict[str, int]]:
    """Mask of the rows that cannot be placed on a timeline, and their count by reason."""
    bad_start = ~np.isfinite(ts)
    bad_dur = ~np.isfinite(dur) & ~bad_start
    with np.errstate(invalid="ignore"):
        negative = (dur < 0) & ~bad_start & ~bad_dur
    counts = {
        NEGATIVE_DURATION: int(negative.sum()),
        BAD_DURATION: int(bad_dur.sum()),
        BAD_START: int(bad_start.sum()),
    }
    return bad_start | bad_dur | negative, {k: v for k, v in counts.items() if v}


def describe_invalid(invalid: Dict[str, int]) -> str:
    """``12 invalid events (7 negative duration, 5 no or non-finite start)``."""
    parts = ", ".join(f"{invalid[r]} {r}" for r in INVALID_REASONS if invalid.get(r))
    return f"{sum(invalid.values())} invalid event(s) ({parts})"


def _take(columns: Dict[str, np.ndarray], rows: Any) -> Dict[str, np.ndarray]:
    """``columns[rows]``, one column at a time, so that at most one extra column is alive."""
    out: Dict[str, np.ndarray] = {}
    for key in list(columns):
        out[key] = columns.pop(key)[rows]
    return out


def keep_rows(columns: Dict[str, np.ndarray], keep: np.ndarray) -> None:
    """Keep the rows of ``keep`` in every column, one column at a time (in place)."""
    if bool(keep.all()):
        return
    for key in list(columns):
        columns[key] = columns.pop(key)[keep]


def build_tables(
    columns: Dict[str, np.ndarray], cats: List[str], names: List[str]
) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """The GPU and CPU tables from columns (``ts, dur, cat, name, pid, tid, stream,
    correlation, launch_ts``; ``cat``/``name`` hold codes into ``cats``/``names``).

    ``columns`` is consumed: each column is moved, not copied, into the tables, and every step
    works one column at a time, so that building costs about one column beyond the result.
    """
    on_gpu = columns["stream"] != -1
    everything = bool(on_gpu.all()) if len(on_gpu) else False
    on_cpu = None if everything else ~on_gpu
    gpu: Dict[str, np.ndarray] = {}
    cpu: Dict[str, np.ndarray] = {}
    for key in list(columns):
        value = columns.pop(key)
        if on_cpu is None:  # all GPU rows: moved, not copied
            gpu[key], cpu[key] = value, value[:0].copy()
        else:
            gpu[key], cpu[key] = value[on_gpu], value[on_cpu]
        del value
    del on_gpu, on_cpu
    return _frame(gpu, cats, names), _frame(cpu, cats, names)


def _frame(columns: Dict[str, np.ndarray], cats: List[str], names: List[str]) -> pd.DataFrame:
    ts = columns["ts"]
    if len(ts) > 1 and not bool(np.all(ts[1:] >= ts[:-1])):
        columns = _take(columns, np.argsort(ts, kind="stable"))
    del ts
    data: Dict[str, Any] = {}
    for key in EVENT_COLUMNS:
        value = columns.pop(key)
        if key in ("cat", "name"):
            labels = pd.Index(list(cats if key == "cat" else names))
            data[key] = pd.Categorical.from_codes(_codes(value), labels)
        elif key == "ts":
            data[key] = np.asarray(value, dtype=np.float64)
        elif key in ("dur", "launch_ts"):
            data[key] = compact_floats(value)
        else:
            data[key] = compact_ints(value)
    return pd.DataFrame(data, copy=False)


def launch_times(
    ts: np.ndarray,
    stream: np.ndarray,
    corr: np.ndarray,
    api_correlation: Optional[np.ndarray] = None,
    api_ts: Optional[np.ndarray] = None,
) -> np.ndarray:
    """For each GPU row, the start of the earliest CPU row with its correlation id (else NaN).

    CPU rows are the rows given plus API calls given separately (not kept in the tables).
    """
    out = np.full(len(ts), np.nan)
    gpu = (stream >= 0) & (corr >= 0)  # HTA's definition of a GPU kernel row
    cpu = ~gpu & (corr >= 0)
    api_corr = np.zeros(0, np.int64) if api_correlation is None else api_correlation
    cpu_corr = np.concatenate([corr[cpu].astype(np.int64), api_corr.astype(np.int64)])
    cpu_ts = np.concatenate([ts[cpu], np.zeros(0) if api_ts is None else api_ts])
    del cpu
    if not len(cpu_corr) or not gpu.any():
        return out
    if not bool(np.all(cpu_corr[1:] > cpu_corr[:-1])):  # usual: one call per id, in id order
        order = np.lexsort((cpu_ts, cpu_corr))
        cpu_corr, cpu_ts = cpu_corr[order], cpu_ts[order]
        del order
        first = np.r_[True, cpu_corr[1:] != cpu_corr[:-1]]  # earliest CPU row of each id
        cpu_corr, cpu_ts = cpu_corr[first], cpu_ts[first]
    gpu_idx = np.flatnonzero(gpu)
    pos = np.minimum(np.searchsorted(cpu_corr, corr[gpu_idx]), len(cpu_corr) - 1)
    hit = cpu_corr[pos] == corr[gpu_idx]
    out[gpu_idx[hit]] = cpu_ts[pos[hit]]
    return out


def names_matching(series: pd.Series, predicate: Any) -> np.ndarray:
    """Rows whose (categorical) name satisfies ``predicate``, tested once per name."""
    cats = series.cat.categories
    hits = np.fromiter((bool(predicate(str(c))) for c in cats), dtype=bool, count=len(cats))
    codes = series.cat.codes.to_numpy()
    mask = np.zeros(len(codes), dtype=bool)
    valid = codes >= 0
    mask[valid] = hits[codes[valid]]
    return mask
