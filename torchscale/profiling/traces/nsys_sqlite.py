"""Read ``nsys export --type sqlite`` files with SQL.

Tables used (Nsight Systems export schema 3.x): ``CUPTI_ACTIVITY_KIND_KERNEL``,
``CUPTI_ACTIVITY_KIND_MEMCPY``, ``CUPTI_ACTIVITY_KIND_MEMSET``, ``CUPTI_ACTIVITY_KIND_RUNTIME``
(launch times, joined on ``correlationId``), ``NVTX_EVENTS`` (push/pop and start/end ranges),
``StringIds``, ``TARGET_INFO_SESSION_START_TIME``, ``TARGET_INFO_GPU`` and
``CUDA_GPU_MEMORY_USAGE_EVENTS`` (CUDA's allocations, for the memory timeline: ``nsys_memory``).
nsys creates tables lazily and its column sets change between versions, so every table and every
column beyond a GPU row's ``start``/``end``/``streamId`` is optional: a missing one degrades what
can be said (no launch times, no GPU names, one rank per process instead of per GPU), never the
file.

One export may hold several GPUs and processes (``nsys profile torchrun ...`` records every
rank): it is split into one :class:`RankTrace` per (process, CUDA device), see ``nsys_ranks``.

Nothing is fetched row by row: joins and per-correlation minima run in SQLite, and each column
comes back as one ``group_concat`` string (in row-id chunks) parsed by numpy; only distinct names
become Python strings. Times are converted to microseconds since the epoch (session start from
``TARGET_INFO_SESSION_START_TIME``), so that traces of different ranks share a clock.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from torchscale.profiling.traces.memory_budget import MemoryBudget
from torchscale.profiling.traces.model import (
    RankTrace,
    api_table,
    build_tables,
    invalid_rows,
    keep_rows,
)
from torchscale.profiling.traces.nsys_memory import memory_events, rank_memory
from torchscale.profiling.traces.nsys_ranks import split_units
from torchscale.profiling.traces.nsys_runtime import (
    PID_SHIFT,
    RuntimeCalls,
    launch_of,
    runtime_calls,
)
from torchscale.profiling.traces.nsys_sql import (
    GLOBAL_ID_PART,
    MISSING,
    col,
    column_chunks,
    columns_of,
    pid_of,
    strings,
    tables_of,
)

# Times are kept as microseconds since 2020-01-01 UTC: small enough for float64 to hold them to
# ~0.03 us, and the same origin for every rank, so ranks stay comparable.
TIME_ORIGIN_NS = 1_577_836_800_000_000_000
NVTX_RANGE_TYPES = (59, 60)  # ENUM_NSYS_EVENT_TYPE: NvtxPushPopRange, NvtxStartEndRange
# copyKind holds CUPTI's CUpti_ActivityMemcpyKind; named as Kineto names copies ("Memcpy HtoD").
_COPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
_GPU_TABLES = {
    "kernel": ("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName"),
    "gpu_memcpy": ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind"),
    "gpu_memset": ("CUPTI_ACTIVITY_KIND_MEMSET", "NULL"),  # no name: "Memset (Device)"
}


def _us(ns: np.ndarray, epoch_ns: int) -> np.ndarray:
    """Session-relative ns -> us since TIME_ORIGIN_NS (integer arithmetic until the division);
    a missing time (NULL) is NaN, an invalid event for the loader to count."""
    us = (ns + (epoch_ns - TIME_ORIGIN_NS if epoch_ns else 0)) / 1000.0
    us[ns == MISSING] = np.nan
    return us


def _dur_us(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Durations from the integer ns (exact: a difference of two ~1e14 us floats is not)."""
    dur: np.ndarray = (end - start) / 1000.0
    dur[(start == MISSING) | (end == MISSING)] = np.nan
    return dur


# One table's columns: ts, dur, name codes, names, then pid, tid, stream, corr, launch, device,
# launch duration, launcher codes (into the same names).
Rows = Tuple[
    np.ndarray, np.ndarray, np.ndarray, List[str], np.ndarray,
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
]  # fmt: skip


def _gpu_rows(
    con: sqlite3.Connection,
    tables: Set[str],
    cat: str,
    epoch_ns: int,
    runtime: RuntimeCalls,
) -> Optional[Rows]:
    table, name_col = _GPU_TABLES[cat]
    if table not in tables:
        return None
    have = columns_of(con, table)
    if not {"start", "end", "streamId"} <= have:
        return None  # not a GPU activity table we can place on a timeline
    if name_col == "demangledName" and name_col not in have:
        name_col = "shortName" if "shortName" in have else "NULL"
    exprs = [
        "t.start",
        "t.end",
        pid_of(col(have, "globalPid", "0")),
        "COALESCE(t.streamId, 0)",
        f"COALESCE({col(have, 'correlationId', '-1')}, -1)",
        f"COALESCE({col(have, 'deviceId', '0')}, 0)",
    ]
    if name_col != "NULL" and name_col in have:
        exprs.append(f"COALESCE(t.{name_col}, -1)")
    columns = column_chunks(con, table, exprs)
    start, end, pid, stream, corr, device = columns[:6]
    name_key = columns[6] if len(columns) > 6 else np.full(len(start), -1, dtype=np.int64)
    if "globalPid" in have:
        launched, launch_end, launch_name = launch_of(pid * PID_SHIFT + corr, runtime.by_pid)
    else:
        launched, launch_end, launch_name = launch_of(corr, runtime.by_corr)
    if cat == "kernel":
        found = strings(con, name_key) if "StringIds" in tables else {}
        names = [found.get(int(k), f"<kernel {k}>") for k in np.unique(name_key)]
        codes = np.searchsorted(np.unique(name_key), name_key)
    elif cat == "gpu_memcpy":
        kinds = np.unique(name_key)
        names = [f"Memcpy {_COPY_KINDS.get(int(k), 'Unknown')}" for k in kinds]
        codes = np.searchsorted(kinds, name_key)
    else:
        names, codes = ["Memset (Device)"], np.zeros(len(start), dtype=np.int64)
    launch_us = np.where(launched >= 0, _us(launched, epoch_ns), np.nan)
    launch_dur = np.where(launched >= 0, (launch_end - launched) / 1000.0, np.nan)
    callers = np.unique(launch_name[launch_name >= 0])
    launcher = np.full(len(start), -1, dtype=np.int64)
    has = launch_name >= 0
    launcher[has] = len(names) + np.searchsorted(callers, launch_name[has])
    names = list(names) + [runtime.names.get(int(i), f"<runtime call {i}>") for i in callers]
    ts = _us(start, epoch_ns)
    dur = _dur_us(start, end)
    return ts, dur, codes, names, pid, stream, stream, corr, launch_us, device, launch_dur, launcher


def _nvtx_text(con: sqlite3.Connection, tables: Set[str], have: Set[str]) -> Tuple[str, str]:
    """SQL for an NVTX event's text (inline, or a registered string) and the join it needs."""
    inline = "t.text" if "text" in have else "NULL"
    if "StringIds" in tables and "textId" in have:
        return f"COALESCE({inline}, s.value)", "LEFT JOIN StringIds s ON s.id = t.textId"
    return inline, ""


def _nvtx_rows(con: sqlite3.Connection, tables: Set[str], epoch_ns: int) -> Optional[Rows]:
    if "NVTX_EVENTS" not in tables:
        return None
    have = columns_of(con, "NVTX_EVENTS")
    if not {"start", "end", "eventType"} <= have:
        return None
    text, strings = _nvtx_text(con, tables, have)
    types = ",".join(str(t) for t in NVTX_RANGE_TYPES)
    ranges = f"t.eventType IN ({types}) AND t.end IS NOT NULL AND {text} IS NOT NULL"
    con.execute("CREATE TEMP TABLE IF NOT EXISTS nvtx_names (name TEXT PRIMARY KEY, idx INTEGER)")
    con.execute("DELETE FROM nvtx_names")
    con.execute(
        f"INSERT INTO nvtx_names SELECT name, ROW_NUMBER() OVER () - 1 FROM "
        f"(SELECT DISTINCT {text} AS name FROM NVTX_EVENTS t {strings} WHERE {ranges})"
    )
    names = [r[0] for r in con.execute("SELECT name FROM nvtx_names ORDER BY idx")]
    gtid = f"COALESCE({col(have, 'globalTid', '0')}, 0)"
    exprs = ["t.start", "t.end", pid_of(gtid), f"{gtid} % {GLOBAL_ID_PART}", "nm.idx"]
    joins = f"{strings} JOIN nvtx_names nm ON nm.name = {text}"
    start, end, pid, thread, codes = column_chunks(con, "NVTX_EVENTS", exprs, joins, ranges)
    minus = np.full(len(start), -1, dtype=np.int64)
    ts = _us(start, epoch_ns)
    nan = np.full(len(start), np.nan)
    return ts, _dur_us(start, end), codes, names, pid, thread, minus, minus, nan, minus, nan, minus


def _rank_marks(con: sqlite3.Connection, tables: Set[str]) -> Dict[int, List[str]]:
    """Per process, the NVTX texts that may say which rank it is (``torchscale rank=3 ...``)."""
    if "NVTX_EVENTS" not in tables:
        return {}
    have = columns_of(con, "NVTX_EVENTS")
    text, strings = _nvtx_text(con, tables, have)
    gtid = f"COALESCE({col(have, 'globalTid', '0')}, 0)"
    found: Dict[int, List[str]] = {}
    query = (
        f"SELECT DISTINCT {pid_of(gtid)}, {text} FROM NVTX_EVENTS t {strings} "
        f"WHERE {text} LIKE '%rank%' LIMIT 10000"
    )
    for pid, value in con.execute(query):
        found.setdefault(int(pid), []).append(str(value))
    return found


def _session_epoch_ns(con: sqlite3.Connection, tables: Set[str]) -> int:
    table = "TARGET_INFO_SESSION_START_TIME"
    if table in tables and "utcEpochNs" in columns_of(con, table):
        row = con.execute(f"SELECT utcEpochNs FROM {table}").fetchone()
        if row and row[0] is not None:
            return int(row[0])
    return 0


def _gpus(con: sqlite3.Connection, tables: Set[str]) -> List[Tuple[int, str]]:
    if "TARGET_INFO_GPU" not in tables or not {"id", "name"} <= columns_of(con, "TARGET_INFO_GPU"):
        return []
    return [(int(i), str(n)) for i, n in con.execute("SELECT id, name FROM TARGET_INFO_GPU")]


COLUMN_KEYS = (
    "ts", "dur", "pid", "tid", "stream", "corr", "launch", "device", "launch_dur", "launcher",
)  # fmt: skip


# nsys names its export metadata table EXPORT_META_DATA (2022.4, schema 3.0.0), later
# META_DATA_EXPORT; either marks a file as an nsys export.
EXPORT_METADATA_TABLES = {"EXPORT_META_DATA", "META_DATA_EXPORT"}


class NoGpuActivity(ValueError):
    """A real nsys export that holds nothing torchscale analyses (no GPU was traced)."""


def _held(parts: Sequence[Tuple[str, Optional[Rows]]]) -> int:
    return sum(a.nbytes for _, p in parts if p for a in p if isinstance(a, np.ndarray))


def read_nsys(path: Path, budget: Optional[MemoryBudget] = None) -> List[RankTrace]:
    """One trace per (process, CUDA device) of the export; see ``nsys_ranks`` for their ranks.

    ``budget``: checked after each table is fetched (see ``memory_budget``)."""
    # A URI, quoted: a '#', '?' or '%' pasted raw would end the path early and open another file
    # read-write-create.
    con = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True)
    try:
        tables = tables_of(con)
        if not tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMCPY"}:
            if tables & EXPORT_METADATA_TABLES:  # an nsys export, of a capture without the GPU
                raise NoGpuActivity(
                    f"{path}: an nsys export with no CUDA kernels, memory copies or NVTX ranges: "
                    "capture with `nsys profile --trace=cuda,nvtx,osrt` on a GPU node"
                )
            raise sqlite3.DatabaseError("no CUDA kernel, memcpy or NVTX table")
        epoch = _session_epoch_ns(con, tables)
        runtime = runtime_calls(con, tables)
        parts: List[Tuple[str, Optional[Rows]]] = []
        for cat in _GPU_TABLES:
            parts.append((cat, _gpu_rows(con, tables, cat, epoch, runtime)))
            if budget is not None:
                held = _held(parts) + runtime.nbytes
                budget.check(held, path, sum(len(p[0]) for _, p in parts if p))
        parts.append(("user_annotation", _nvtx_rows(con, tables, epoch)))
        memory = memory_events(con, tables)
        if budget is not None and memory is not None:  # millions of rows with memory usage on
            held = _held(parts) + runtime.nbytes + memory.nbytes
            budget.check(held, path, sum(len(p[0]) for _, p in parts if p) + len(memory.start))
        gpus = _gpus(con, tables)
        marks = _rank_marks(con, tables)
    finally:
        con.close()
    found = [(c, p) for c, p in parts if p is not None]
    if not found:
        raise sqlite3.DatabaseError("its CUDA and NVTX tables have no start/end/streamId columns")
    cats = [c for c, _ in found]
    names: List[str] = []
    cols: Dict[str, List[np.ndarray]] = {k: [] for k in (*COLUMN_KEYS, "cat", "name")}
    for cat_code, (_, (ts, dur, codes, part_names, *rest)) in enumerate(found):
        for key, value in zip(COLUMN_KEYS, (ts, dur, *rest)):
            cols[key].append(np.asarray(value))
        launcher = cols["launcher"][-1]  # codes into this part's names: offset like the names
        cols["launcher"][-1] = np.where(launcher >= 0, launcher + len(names), -1)
        cols["cat"].append(np.full(len(ts), cat_code))
        cols["name"].append(np.asarray(codes) + len(names))
        names += part_names
    call_names = np.unique(runtime.name_id[runtime.name_id >= 0])
    api_names = [runtime.names.get(int(i), f"<runtime call {i}>") for i in call_names]
    api_codes = np.where(
        runtime.name_id >= 0, len(names) + np.searchsorted(call_names, runtime.name_id), -1
    )
    names += api_names
    flat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    unique_names, remap = (
        np.unique(np.asarray(names, dtype=object), return_inverse=True)
        if names
        else (np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64))
    )

    def recoded(codes: np.ndarray) -> np.ndarray:
        codes = codes.astype(np.int64)
        return np.where(codes >= 0, remap[np.maximum(codes, 0)], -1) if len(names) else codes

    flat["name"] = recoded(flat["name"])
    flat["launcher"] = recoded(flat["launcher"])
    api_codes = recoded(api_codes)
    api_ts, api_dur = _us(runtime.start, epoch), _dur_us(runtime.start, runtime.end)
    memory_us = _us(memory.start, epoch) if memory is not None else np.zeros(0)
    traces = []
    for unit in split_units(flat["pid"], flat["device"], flat["stream"], marks, gpus):
        rows = unit.rows
        columns = {key: flat[source][rows] for key, source in _TABLE_COLUMNS}
        bad, invalid = invalid_rows(columns["ts"], columns["dur"])
        keep_rows(columns, ~bad)
        gpu, cpu = build_tables(columns, cats, list(unique_names))
        pid = unit.metadata.get("pid")
        mine = (runtime.pid == pid) if pid else slice(None)  # pid 0 or None: the whole export
        api = {"ts": api_ts[mine], "dur": api_dur[mine], "name": api_codes[mine]}
        keep_rows(api, ~invalid_rows(api["ts"], api["dur"])[0])
        single = isinstance(rows, slice)  # one unit: the whole export is this rank's
        traces.append(
            RankTrace(
                rank=unit.rank,
                path=path,
                source="nsys",
                gpu=gpu,
                cpu=cpu,
                metadata={**unit.metadata, "session_start_epoch_ns": epoch},
                invalid=invalid,
                api=api_table(api, list(unique_names)),
                memory=rank_memory(memory, memory_us, None if single else unit.metadata),
            )
        )
    return traces


# The tables' columns and the export's arrays they come from.
_TABLE_COLUMNS = (
    ("ts", "ts"), ("dur", "dur"), ("cat", "cat"), ("name", "name"), ("pid", "pid"),
    ("tid", "tid"), ("stream", "stream"), ("correlation", "corr"), ("launch_ts", "launch"),
    ("launch_dur", "launch_dur"), ("launcher", "launcher"),
)  # fmt: skip
