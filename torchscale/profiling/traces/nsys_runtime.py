"""The CUDA runtime calls of an nsys export: every call (``RankTrace.api``) and the lookup of
each GPU row's launching call by (process, correlation id)."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Dict, Set, Tuple

import numpy as np

from torchscale.profiling.traces.nsys_sql import col, column_chunks, columns_of, pid_of, strings

# sorted keys, and per key the first call's start, end (ns) and name id
Lookup = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
PID_SHIFT = np.int64(1 << 32)  # correlation ids are 32-bit: (pid, id) packs into one int64
_API_VERSION = re.compile(r"_v\d+$")


@dataclass
class RuntimeCalls:
    """The CUDA runtime table: every call (for ``RankTrace.api``) and the launch lookups."""

    start: np.ndarray
    end: np.ndarray
    name_id: np.ndarray
    pid: np.ndarray
    by_pid: Lookup
    by_corr: Lookup
    names: Dict[int, str]

    @property
    def nbytes(self) -> int:
        arrays = (self.start, self.end, self.name_id, self.pid, *self.by_pid, *self.by_corr)
        return sum(a.nbytes for a in arrays)


def _first_per_key(key: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray) -> Lookup:
    order = np.lexsort((start, key))
    key, start, end, name = key[order], start[order], end[order], name[order]
    first = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, dtype=bool)
    return key[first], start[first], end[first], name[first]


def runtime_calls(con: sqlite3.Connection, tables: Set[str]) -> RuntimeCalls:
    """The runtime table's calls, and the earliest call per (process, correlation id) and per
    correlation id alone (for GPU rows that do not say their process).

    CUPTI numbers correlations per process, so in an export of several processes the same id
    is several launches. Joining in SQL costs a sort of the whole runtime table (nsys creates no
    index); ``group_concat`` columns and a numpy sort are several times faster.
    """
    none = np.zeros(0, dtype=np.int64)
    empty = RuntimeCalls(none, none, none, none, (none,) * 4, (none,) * 4, {})
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return empty
    have = columns_of(con, "CUPTI_ACTIVITY_KIND_RUNTIME")
    if not {"start", "end"} <= have:
        return empty
    corr, start, end, pid, name = column_chunks(
        con,
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        [
            f"COALESCE({col(have, 'correlationId', '-1')}, -1)",
            "t.start",
            "t.end",
            pid_of(col(have, "globalTid", "0")),
            f"COALESCE({col(have, 'nameId', '-1')}, -1)",
        ],
    )
    names = strings(con, name[name >= 0]) if "StringIds" in tables else {}
    # nsys names calls with the API version they entered by ("cudaLaunchKernel_v7000"): the
    # name Kineto and HTA use is without it
    names = {k: _API_VERSION.sub("", v) for k, v in names.items()}
    linked = corr >= 0
    c, st, en, nm, pi = corr[linked], start[linked], end[linked], name[linked], pid[linked]
    return RuntimeCalls(
        start,
        end,
        name,
        pid,
        _first_per_key(pi * PID_SHIFT + c, st, en, nm),
        _first_per_key(c, st, en, nm),
        names,
    )


def launch_of(corr: np.ndarray, lookup: Lookup) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, end and name id of each correlation's launch (-1 where none)."""
    ids, starts, ends, names = lookup
    out = [np.full(len(corr), -1, dtype=np.int64) for _ in range(3)]
    if len(ids) and len(corr):
        pos = np.minimum(np.searchsorted(ids, corr), len(ids) - 1)
        hit = ids[pos] == corr
        for column, values in zip(out, (starts, ends, names)):
            column[hit] = values[pos[hit]]
    return out[0], out[1], out[2]
