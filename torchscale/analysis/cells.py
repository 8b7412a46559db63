"""Per-cell and per-rank tables beyond the training table: latency, step samples, memory, ranks.

Each function takes result records and returns a DataFrame keyed by ``cell_id``; join with the
training table (``tables.training_table``) for model, variant and GPU count.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import numpy as np
import pandas as pd

from torchscale.measures.stats import time_stats
from torchscale.results.schema import CollectiveResult, ResultBase, TrainingResult

LATENCY_COLUMNS = ["cell_id", "steps", "mean", "p50", "p95", "p99", "min", "max", "std", "cv"]
MEMORY_PARTS = ["params_bytes", "grads_bytes", "optimizer_bytes", "activations_peak_bytes"]


def _measured(records: Iterable[ResultBase]) -> List[TrainingResult]:
    return [r for r in records if isinstance(r, TrainingResult) and r.status == "ok"]


def latency_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """Step-time distribution of each measured cell (the slowest rank's time per step), in ms."""
    rows = [
        {"cell_id": r.cell_id, "steps": len(r.step_times_ms), **r.step_time_ms.model_dump()}
        for r in _measured(records)
        if r.step_time_ms is not None
    ]
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)


def pooled_latency_table(table: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Step-time statistics per configuration and GPU count, repeats pooled.

    ``table`` is the labelled training table (``scaling.label_variants``), ``samples`` the
    output of :func:`step_samples`.
    """
    keys = ["experiment", "model", "variant", "world_size"]
    joined = samples.merge(table[["cell_id", *keys]], on="cell_id")
    rows = []
    for key, group in joined.groupby(keys, sort=True):
        stats = time_stats(group["step_ms"].to_numpy(dtype=np.float64))
        rows.append(
            {
                **dict(zip(keys, key)),
                "runs": group["cell_id"].nunique(),
                "steps": len(group),
                **(stats or {}),
            }
        )
    return pd.DataFrame(rows, columns=[*keys, "runs", *LATENCY_COLUMNS[1:]])


def step_samples(records: Iterable[ResultBase]) -> pd.DataFrame:
    """Long format: one row per measured step of each cell (``cell_id``, ``step``, ``step_ms``)."""
    measured = [r for r in _measured(records) if r.step_times_ms]
    lengths = [len(r.step_times_ms) for r in measured]
    return pd.DataFrame(
        {
            "cell_id": np.repeat(np.array([r.cell_id for r in measured], dtype=object), lengths),
            "step": np.concatenate([np.arange(n) for n in lengths]) if lengths else [],
            "step_ms": np.concatenate([r.step_times_ms for r in measured]) if lengths else [],
        },
        columns=["cell_id", "step", "step_ms"],
    )


def memory_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """Memory of the rank with the highest peak, split into model states and activations."""
    rows = []
    for record in _measured(records):
        memory = record.memory
        if memory is None:
            continue
        row = {"cell_id": record.cell_id, **{part: getattr(memory, part) for part in MEMORY_PARTS}}
        row["peak_bytes"] = memory.peak_bytes
        row["peak_kind"] = memory.peak_kind
        rows.append(row)
    return pd.DataFrame(rows, columns=["cell_id", *MEMORY_PARTS, "peak_bytes", "peak_kind"])


def memory_by_variant(table: pd.DataFrame, memory: pd.DataFrame) -> pd.DataFrame:
    """Memory of each configuration at its smallest GPU count (first run): what a GPU holds.

    ``table`` is the labelled training table, ``memory`` the output of :func:`memory_table`.
    """
    keys = ["experiment", "model", "variant"]
    kept = ["cell_id", *keys, "world_size", "repeat", "gpu_memory_util_pct"]
    joined = table[[c for c in kept if c in table]].merge(memory, on="cell_id")
    smallest = joined.groupby(keys)["world_size"].transform("min")
    joined = joined[joined["world_size"] == smallest].sort_values([*keys, "repeat"])
    return joined.drop_duplicates(keys).drop(columns=["repeat"]).reset_index(drop=True)


def pooled_rank_table(table: pd.DataFrame, ranks: pd.DataFrame) -> pd.DataFrame:
    """Per rank at each configuration's largest GPU count, averaged over repeats."""
    keys = ["experiment", "model", "variant", "config_key"]
    multi = table[(table["status"] == "ok") & (table["world_size"] > 1)]
    largest = multi.groupby(["experiment", "config_key"])["world_size"].transform("max")
    cells = multi[multi["world_size"] == largest][["cell_id", *keys, "world_size"]]
    joined = cells.merge(ranks, on="cell_id")
    values = ["step_ms_mean", "nosync_step_ms", "sync_wait_ms", "sync_wait_pct"]
    pooled = joined.groupby([*keys, "world_size", "rank"], as_index=False, sort=True).agg(
        runs=("cell_id", "nunique"),
        is_slowest=("is_slowest", "any"),
        **{v: (v, "mean") for v in values},
    )
    return pooled.drop(columns=["config_key"])


def rank_wait_matrix(pooled_ranks: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: each rank's mean sync wait side by side (``rank_0`` ...), the
    straggler the worker named, and the spread between the longest and shortest wait."""
    keys = ["experiment", "model", "variant", "world_size"]
    if pooled_ranks.empty:
        return pd.DataFrame(columns=[*keys, "step_ms", "spread_ms", "straggler"])
    waits = pooled_ranks.pivot_table(
        index=keys, columns="rank", values="sync_wait_ms", aggfunc="mean", sort=True
    )
    waits.columns = [f"rank_{int(r)}" for r in waits.columns]
    grouped = pooled_ranks.groupby(keys, sort=True)
    slowest = pooled_ranks[pooled_ranks["is_slowest"]].groupby(keys)["rank"].first()
    summary = pd.DataFrame(
        {
            "step_ms": grouped["step_ms_mean"].mean(),
            "spread_ms": grouped["sync_wait_ms"].max() - grouped["sync_wait_ms"].min(),
        }
    )
    summary["straggler"] = slowest.reindex(summary.index)
    return summary.join(waits).reset_index()


def rank_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per rank of each measured cell: where its step time goes and how long it waits.

    ``is_slowest`` marks the straggler the worker named (the rank the others wait for).
    """
    columns = [
        "cell_id",
        "rank",
        "host",
        "step_ms_mean",
        "step_ms_p95",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "data_ms",
        "nosync_step_ms",
        "sync_wait_ms",
        "sync_wait_pct",
        "peak_memory_bytes",
        "is_slowest",
    ]
    rows = []
    for record in _measured(records):
        slowest = record.sync.slowest_rank if record.sync else None
        for rank in record.per_rank:
            step = rank.step_time_ms.mean
            wait = rank.sync_wait_ms
            rows.append(
                {
                    "cell_id": record.cell_id,
                    "rank": rank.rank,
                    "host": rank.host,
                    "step_ms_mean": step,
                    "step_ms_p95": rank.step_time_ms.p95,
                    "forward_ms": rank.forward_ms,
                    "backward_ms": rank.backward_ms,
                    "optimizer_ms": rank.optimizer_ms,
                    "data_ms": rank.data_ms,
                    "nosync_step_ms": rank.nosync_step_ms,
                    "sync_wait_ms": wait,
                    "sync_wait_pct": 100 * wait / step if wait is not None and step > 0 else None,
                    "peak_memory_bytes": rank.memory.peak_bytes if rank.memory else None,
                    "is_slowest": slowest == rank.rank,
                }
            )
    return pd.DataFrame(rows, columns=columns)


def failure_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """Every record of any kind that did not measure (oom, timeout, failed, skipped), with why;
    a kind this torchscale does not know is listed too (read as ``ResultBase``)."""
    columns = [
        "cell_id",
        "experiment",
        "kind",
        "model",
        "batch_size",
        "world_size",
        "status",
        "reason",
    ]
    rows = [
        {
            "cell_id": record.cell_id,
            "experiment": record.experiment,
            "kind": record.kind,
            "model": _what(record),
            "batch_size": record.batch_size if isinstance(record, TrainingResult) else None,
            "world_size": record.world_size,
            "status": record.status,
            "reason": record.error or "(no reason recorded)",
        }
        for record in records
        if record.status != "ok"
    ]
    return pd.DataFrame(rows, columns=columns)


def _what(record: ResultBase) -> Optional[str]:
    """What the record measured: the model, or the collective."""
    if isinstance(record, TrainingResult):
        return record.model
    return record.op if isinstance(record, CollectiveResult) else None
