"""Kernel classes (HTA's rules, widened for NCCL and gloo) and kernel time by class."""

from __future__ import annotations

import re
from typing import List

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers import intervals
from torchscale.profiling.traces.model import RankTrace, names_matching

COMPUTE, COMMUNICATION, MEMORY, OTHER = "compute", "communication", "memory", "other"
KERNEL_CLASSES = (COMPUTE, COMMUNICATION, MEMORY, OTHER)

# HTA: communication = ^nccl.*Kernel. We take every kernel whose name starts with "nccl"
# (ncclKernel_*, ncclDevKernel_* and anything newer NCCL may call its kernels): on HTA's own
# traces the two rules pick the same kernels.
COMM_KERNEL_RE = re.compile(r"^nccl")
MEMORY_KERNEL_RE = re.compile(r"^(Memcpy|Memset|dma)")  # HTA's rule, unchanged
# HTA counts as computation whatever is neither of the above nor a copy/set/sync (its regex).
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# Collectives that run on the CPU (gloo) are recorded by torch as ranges on gloo's worker threads,
# e.g. "gloo:all_reduce", spanning the whole operation including the wait for the other ranks
# (checked with torch 2.14). "c10d::allreduce_" only enqueues the work, so it is not counted.
CPU_COLLECTIVE_RE = re.compile(r"^gloo:")
# The host's own calls around a collective (c10d's enqueue, its parameter record): work that
# launches communication, neither computation nor the collective.
CPU_COMM_CALL_RE = re.compile(r"^(?:c10d::|record_param_comms|gloo:|nccl:)")


def kernel_class(name: str) -> str:
    if COMM_KERNEL_RE.match(name):
        return COMMUNICATION
    if MEMORY_KERNEL_RE.match(name):
        return MEMORY
    if not NOT_COMPUTE_RE.match(name):
        return COMPUTE
    return OTHER


def classify(names: pd.Series) -> np.ndarray:
    """Class of each row of a categorical name column, computed once per distinct name (an
    object array: 8 bytes a row; :func:`class_mask` costs one)."""
    cats = names.cat.categories
    per_name = np.asarray([kernel_class(str(c)) for c in cats] + [OTHER], dtype=object)
    return per_name[names.cat.codes.to_numpy()]


def class_mask(names: pd.Series, cls: str) -> np.ndarray:
    """Rows of a categorical name column whose kernel class is ``cls``."""
    return names_matching(names, lambda name: kernel_class(name) == cls)


def cpu_collectives(trace: RankTrace) -> pd.DataFrame:
    """CPU-side collective ranges (gloo)."""
    cpu = trace.cpu_events()
    return cpu[names_matching(cpu["name"], CPU_COLLECTIVE_RE.match)]


def cpu_compute_ops(trace: RankTrace) -> pd.DataFrame:
    """CPU operators (``cpu_op`` rows) that compute: all but the calls around a collective.
    Annotations and Python frames are left out (they span whole phases, not work)."""
    cpu = trace.cpu_events()
    ops = (cpu["cat"] == "cpu_op").to_numpy() & ~names_matching(cpu["name"], CPU_COMM_CALL_RE.match)
    kept: pd.DataFrame = cpu[ops]
    return kept


def kernel_time_by_class(traces: List[RankTrace]) -> pd.DataFrame:
    """Per rank and class: number of kernels, summed and merged (wall-clock) time, share of the
    rank's GPU busy time. gloo collectives on the CPU appear as class ``communication`` with
    ``device`` = ``cpu``."""
    rows = []
    for trace in traces:
        gpu = trace.gpu_events()
        ts, dur = gpu["ts"].to_numpy(), gpu["dur"].to_numpy()
        busy = intervals.union_length(ts, durations=dur)
        for cls in KERNEL_CLASSES:
            sel = class_mask(gpu["name"], cls)
            if sel.any():
                merged = intervals.union_length(ts, None, sel, durations=dur)
                rows.append(
                    (
                        trace.rank,
                        "gpu",
                        cls,
                        int(sel.sum()),
                        float(gpu["dur"].to_numpy()[sel].sum()),
                        merged,
                        100.0 * merged / busy if busy else float("nan"),
                    )
                )
        coll = cpu_collectives(trace)
        if len(coll):
            merged = intervals.union_length(
                coll["ts"].to_numpy(), (coll["ts"] + coll["dur"]).to_numpy()
            )
            rows.append(
                (
                    trace.rank,
                    "cpu",
                    COMMUNICATION,
                    len(coll),
                    float(coll["dur"].sum()),
                    merged,
                    float("nan"),
                )
            )
    return pd.DataFrame(
        rows,
        columns=[
            "rank",
            "device",
            "kernel_class",
            "count",
            "time_us",
            "merged_time_us",
            "pct_of_busy",
        ],
    )
