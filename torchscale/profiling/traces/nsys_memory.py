"""CUDA's own memory events in an nsys export (``CUDA_GPU_MEMORY_USAGE_EVENTS``, written when
capturing with ``nsys profile --cuda-memory-usage=true``), as a rank's memory table.

Each row is one allocation or deallocation through CUDA (``cudaMalloc``, ``cudaFree``,
``cudaMallocAsync``, ``cudaHostAlloc``, ...) with its size: ``memoryOperationType`` 0 allocates,
1 frees (``ENUM_CUDA_DEV_MEM_EVENT_OPER``); ``memKind`` says where (``ENUM_CUDA_MEM_KIND``: 0
pageable and 1 pinned host memory, 2 device, 3 array, 4 managed, 5 device static, 6 managed
static, 7 unknown). The table is the running total of what is allocated, per process and place:
host kinds as the host (device type 0, device -1, as torch numbers the CPU), every other kind as
the CUDA device the row names (device type 1). nsys records no totals, so the total counts from
0 at the start of the capture (memory allocated before it is not known), and ``reserved`` is
unknown (NaN). What CUDA sees is what PyTorch's caching allocator reserves from it, not the
tensors inside: nsys's ``allocated`` compares with a Kineto trace's ``reserved``.

Columns beyond ``start``, ``bytes`` and ``memoryOperationType`` are optional (no ``memKind``:
device memory; no ``deviceId``: the rank's device, else 0). In an export of several ranks,
events go to the rank of their process and device, matched on whichever of ``globalPid`` and
``deviceId`` the table has (with neither they cannot be placed and are left out). Rows of any
other operation type, or a NULL start or size, are left out.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Dict, Optional, Set, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.traces.model import MEMORY_COLUMNS, memory_table
from torchscale.profiling.traces.nsys_sql import MISSING, col, column_chunks, columns_of, pid_of

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
ALLOCATION, DEALLOCATION = 0, 1  # ENUM_CUDA_DEV_MEM_EVENT_OPER
HOST_KINDS = (0, 1)  # ENUM_CUDA_MEM_KIND: pageable, pinned
DEVICE_MEMORY = 2  # ENUM_CUDA_MEM_KIND: device (what a row without memKind is taken as)
CPU, CUDA = 0, 1  # torch's DeviceType numbers, as the memory table holds them


@dataclass
class MemoryEvents:
    """The export's memory events, in start order: start (ns, session time), process, device,
    signed size (+ allocated, - freed) and whether the memory is the host's."""

    start: np.ndarray
    pid: np.ndarray
    device: np.ndarray
    change: np.ndarray
    host: np.ndarray
    # which of process and device the table says (an export of several ranks is split on them)
    keys: Tuple[str, ...] = ("pid", "device")

    @property
    def nbytes(self) -> int:
        arrays = (self.start, self.pid, self.device, self.change, self.host)
        return sum(a.nbytes for a in arrays)


def memory_events(con: sqlite3.Connection, tables: Set[str]) -> Optional[MemoryEvents]:
    """The table's events, or None when the export has no usable memory table."""
    if TABLE not in tables:
        return None
    have = columns_of(con, TABLE)
    if not {"start", "bytes", "memoryOperationType"} <= have:
        return None
    exprs = [
        "t.start",
        pid_of(col(have, "globalPid", "0")),
        f"COALESCE({col(have, 'deviceId', '0')}, 0)",
        "t.bytes",
        "t.memoryOperationType",
        f"COALESCE({col(have, 'memKind', str(DEVICE_MEMORY))}, {DEVICE_MEMORY})",
    ]
    start, pid, device, size, operation, kind = column_chunks(con, TABLE, exprs)
    known = (start != MISSING) & (size != MISSING) & np.isin(operation, (ALLOCATION, DEALLOCATION))
    order = np.argsort(start[known], kind="stable")
    signed = np.where(operation == ALLOCATION, size, -size)
    return MemoryEvents(
        start[known][order],
        pid[known][order],
        device[known][order],
        signed[known][order],
        np.isin(kind, HOST_KINDS)[known][order],
        tuple(k for k, c in (("pid", "globalPid"), ("device", "deviceId")) if c in have),
    )


def rank_memory(
    events: Optional[MemoryEvents], start_us: np.ndarray, unit: Optional[Dict[str, object]]
) -> pd.DataFrame:
    """A rank's memory table (``model.memory_table``): the events of its process and CUDA device
    (``unit``'s ``pid`` and ``device``; every event when ``unit`` is None: one rank in the
    export), whose starts are ``start_us`` (us, the traces' clock), with the running total of
    each place. Matched on what the table says of the two: with neither (an export of several
    ranks), its events belong to no rank."""
    if events is None:
        return memory_table({})
    rows = np.ones(len(events.start), dtype=bool)
    if unit is not None:
        rows &= bool(events.keys)
        for key in events.keys:
            rows &= getattr(events, key) == unit.get(key)
    host = events.host[rows]
    device = events.device[rows]
    if "device" not in events.keys and unit is not None:  # the rank's own device
        device = np.full(len(device), unit.get("device"))
    frame = pd.DataFrame(
        {
            "ts": start_us[rows],
            "device_type": np.where(host, CPU, CUDA).astype(np.float64),
            "device": np.where(host, -1, device).astype(np.float64),
            "bytes": events.change[rows].astype(np.float64),
        }
    )
    frame["allocated"] = frame.groupby(["device_type", "device"], sort=False)["bytes"].cumsum()
    frame["reserved"] = np.nan
    return memory_table({key: frame[key].to_numpy() for key in MEMORY_COLUMNS})
