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
launch_dur  float32   ... that call's duration (NaN if unknown)
launcher    category  ... that call's name (cudaLaunchKernel, hipLaunchKernel, ...; NaN if unknown)
=========== ========= ============================================================================

Integer columns take the smallest type that holds their values (a stream id needs one byte, a
correlation id four): memory is what bounds the largest trace that can be analysed (about
40 bytes an event kept, nothing per event dropped). CUDA API calls (``cuda_runtime`` /
``cuda_driver``) are as many as the kernels: they are kept apart, in ``RankTrace.api`` (start,
duration, name), to count them.

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

EVENT_COLUMNS = (
    "ts", "dur", "cat", "name", "pid", "tid", "stream", "correlation",
    "launch_ts", "launch_dur", "launcher",
)  # fmt: skip
API_COLUMNS = ("ts", "dur", "name")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Why an event is invalid, in the order reported.
NEGATIVE_DURATION = "negative duration"
BAD_DURATION = "no or non-finite duration"
BAD_START = "no or non-finite start"
ABSURD_DURATION = "duration over a week"
MEMORY_WITHOUT_FIGURES = "memory event without its device or sizes"
INVALID_REASONS = (
    NEGATIVE_DURATION,
    BAD_DURATION,
    BAD_START,
    ABSURD_DURATION,
    MEMORY_WITHOUT_FIGURES,
)
MAX_DURATION_US = 7 * 86400 * 1e6
"""No profiled event lasts a week (a capture is seconds): a longer one (``dur: 1e300``) is a
damaged or forged event, and kept it would make every share of its rank's time meaningless."""


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
    # CUDA API calls (runtime and driver): start, duration, name; sorted by start.
    api: pd.DataFrame = field(default_factory=lambda: empty_api())
    # Memory events (Kineto's ``[memory]`` instants): see ``memory_table``; empty when none.
    memory: pd.DataFrame = field(default_factory=lambda: empty_memory())

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


MEMORY_COLUMNS = ("ts", "device_type", "device", "bytes", "allocated", "reserved")
MEMORY_NEEDED = ("ts", "device_type", "allocated")  # without them an event places nothing


def empty_api() -> pd.DataFrame:
    return pd.DataFrame(
        {"ts": np.zeros(0), "dur": np.zeros(0, np.float32), "name": pd.Categorical([])}
    )


def empty_memory() -> pd.DataFrame:
    return pd.DataFrame({c: np.zeros(0) for c in MEMORY_COLUMNS})


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
    with np.errstate(over="ignore"):  # a value past float32's range stays float64, below
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
        absurd = (dur > MAX_DURATION_US) & ~bad_start & ~bad_dur
    counts = {
        NEGATIVE_DURATION: int(negative.sum()),
        BAD_DURATION: int(bad_dur.sum()),
        BAD_START: int(bad_start.sum()),
        ABSURD_DURATION: int(absurd.sum()),
    }
    return bad_start | bad_dur | negative | absurd, {k: v for k, v in counts.items() if v}


def invalid_memory_rows(memory: Dict[str, np.ndarray]) -> Tuple[np.ndarray, Dict[str, int]]:
    """Mask of the memory events that cannot be placed (no finite start, device type or
    allocated total: a ``[memory]`` event without its ``args``), and their count."""
    columns = [np.asarray(memory.get(k, np.zeros(0)), dtype=np.float64) for k in MEMORY_NEEDED]
    bad = np.zeros(len(columns[0]), dtype=bool)
    for column in columns:
        bad |= ~np.isfinite(column)
    count = int(bad.sum())
    return bad, ({MEMORY_WITHOUT_FIGURES: count} if count else {})


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


def split_rows(
    columns: Dict[str, np.ndarray],
) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """GPU rows (a stream) and CPU rows of ``columns``, which is consumed one column at a time
    (building costs about one column beyond the result; all-GPU columns are moved, not copied).
    """
    on_gpu = columns["stream"] != -1
    everything = bool(on_gpu.all()) if len(on_gpu) else False
    on_cpu = None if everything else ~on_gpu
    gpu: Dict[str, np.ndarray] = {}
    cpu: Dict[str, np.ndarray] = {}
    for key in list(columns):
        value = columns.pop(key)
        if on_cpu is None:
            gpu[key], cpu[key] = value, value[:0].copy()
        else:
            gpu[key], cpu[key] = value[on_gpu], value[on_cpu]
        del value
    return gpu, cpu


def build_tables(
    columns: Dict[str, np.ndarray], cats: List[str], names: List[str]
) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """The GPU and CPU tables from columns (``EVENT_COLUMNS``; ``cat``, ``name`` and
    ``launcher`` hold codes into ``cats``/``names``); ``columns`` is consumed."""
    gpu, cpu = split_rows(columns)
    return table(gpu, cats, names), table(cpu, cats, names)


def table(columns: Dict[str, np.ndarray], cats: List[str], names: List[str]) -> pd.DataFrame:
    """One table, sorted by start, from consumed columns. Launch columns a CPU table lacks
    (the readers link launches for GPU rows only) are filled as unknown, in one byte or four."""
    n = len(columns["ts"])
    columns.setdefault("launch_ts", np.full(n, np.nan, dtype=np.float32))
    columns.setdefault("launch_dur", np.full(n, np.nan, dtype=np.float32))
    columns.setdefault("launcher", np.full(n, -1, dtype=np.int8))
    ts = columns["ts"]
    if len(ts) > 1 and not bool(np.all(ts[1:] >= ts[:-1])):
        columns = _take(columns, np.argsort(ts, kind="stable"))
    del ts
    data: Dict[str, Any] = {}
    for key in EVENT_COLUMNS:
        value = columns.pop(key)
        if key in ("cat", "name", "launcher"):
            labels = pd.Index(list(cats if key == "cat" else names))
            data[key] = pd.Categorical.from_codes(_codes(value), labels)
        elif key == "ts":
            data[key] = np.asarray(value, dtype=np.float64)
        elif key in ("dur", "launch_ts", "launch_dur"):
            data[key] = compact_floats(value)
        else:
            data[key] = compact_ints(value)
    return pd.DataFrame(data, copy=False)


def link_launches(
    gpu: Dict[str, np.ndarray], cpu: Dict[str, np.ndarray], api: Dict[str, np.ndarray]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each GPU row with a correlation id, the earliest CPU row or API call with that id:
    its start, its duration and its name code (NaN, NaN, -1 when none).

    ``gpu``/``cpu``: the rows' columns (``ts, dur, name, correlation``); ``api``: CUDA API calls
    kept apart (``ts, dur, name, correlation``); name codes index the same list.
    """
    corr = gpu["correlation"]
    launch_ts = np.full(len(corr), np.nan)
    launch_dur = np.full(len(corr), np.nan, dtype=np.float32)
    launcher = np.full(len(corr), -1, dtype=np.int32)
    linked = cpu["correlation"] >= 0
    keys = np.concatenate([cpu["correlation"][linked], api["correlation"]])
    starts = np.concatenate([cpu["ts"][linked], api["ts"]])
    durs = np.concatenate([cpu["dur"][linked], api["dur"]]).astype(np.float32)
    names = np.concatenate([cpu["name"][linked], api["name"]])
    del linked
    if not len(keys) or not len(corr):
        return launch_ts, launch_dur, launcher
    if not bool(np.all(keys[1:] > keys[:-1])):  # usual: one call per id, in id order
        order = np.lexsort((starts, keys))
        keys, starts, durs, names = keys[order], starts[order], durs[order], names[order]
        first = np.r_[True, keys[1:] != keys[:-1]]  # earliest CPU row of each id
        keys, starts, durs, names = keys[first], starts[first], durs[first], names[first]
        del order, first
    rows = np.flatnonzero(corr >= 0)  # HTA's GPU kernel rows: a stream and a correlation id
    pos = np.minimum(np.searchsorted(keys, corr[rows]), len(keys) - 1)
    hit = keys[pos] == corr[rows]
    rows, pos = rows[hit], pos[hit]
    launch_ts[rows], launch_dur[rows], launcher[rows] = starts[pos], durs[pos], names[pos]
    return launch_ts, launch_dur, launcher


def api_table(api: Dict[str, np.ndarray], names: List[str]) -> pd.DataFrame:
    """CUDA API calls kept for counting (``ts, dur, name``), sorted by start."""
    order = np.argsort(api["ts"], kind="stable") if not _sorted(api["ts"]) else slice(None)
    return pd.DataFrame(
        {
            "ts": np.asarray(api["ts"], dtype=np.float64)[order],
            "dur": compact_floats(np.asarray(api["dur"])[order]),
            "name": pd.Categorical.from_codes(_codes(api["name"][order]), pd.Index(names)),
        },
        copy=False,
    )


def memory_table(memory: Dict[str, np.ndarray]) -> pd.DataFrame:
    """Memory events (``MEMORY_COLUMNS``) with a finite start, sorted by start; sizes in bytes,
    device type as torch numbers it (0 CPU, 1 CUDA, ...), device -1 for the host."""
    columns = {k: np.asarray(memory.get(k, np.zeros(0)), dtype=np.float64) for k in MEMORY_COLUMNS}
    keep = np.isfinite(columns["ts"])
    order = np.argsort(columns["ts"][keep], kind="stable")
    return pd.DataFrame({k: v[keep][order] for k, v in columns.items()})


def _sorted(values: np.ndarray) -> bool:
    return len(values) < 2 or bool(np.all(values[1:] >= values[:-1]))


def names_matching(series: pd.Series, predicate: Any) -> np.ndarray:
    """Rows whose (categorical) name satisfies ``predicate``, tested once per name."""
    cats = series.cat.categories
    hits = np.fromiter((bool(predicate(str(c))) for c in cats), dtype=bool, count=len(cats))
    codes = series.cat.codes.to_numpy()
    mask = np.zeros(len(codes), dtype=bool)
    valid = codes >= 0
    mask[valid] = hits[codes[valid]]
    return mask
