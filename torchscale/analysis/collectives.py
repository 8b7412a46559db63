"""Communication benchmark records (``kind: collective``) -> a bandwidth table.

Read from the raw ``results.jsonl`` objects, defensively: the fields follow the nccl-tests
definitions (``algbw = bytes / time``, ``busbw = algbw x the op's factor``), computed when the
record is written; nothing is recomputed here.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional

import pandas as pd

COLLECTIVE_KIND = "collective"
COLUMNS = [
    "experiment",
    "op",
    "scope",
    "group_size",
    "dtype",
    "world_size",
    "nnodes",
    "size_bytes",
    "time_us",
    "algbw_gbps",
    "busbw_gbps",
    "link_peak_gbps",
    "busbw_peak_fraction",
    "wrong",
    "status",
    "error",
]


def _number(value: Any) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _row(doc: Mapping[str, Any]) -> Dict[str, object]:
    peak = _number(doc.get("link_peak_gbps", doc.get("peak_busbw_gbps")))
    busbw = _number(doc.get("busbw_gbps"))
    return {
        "experiment": doc.get("experiment"),
        "op": str(doc.get("op", "?")),
        "scope": doc.get("scope", "world"),
        "group_size": doc.get("group_size") or doc.get("world_size"),
        "dtype": doc.get("dtype"),
        "world_size": doc.get("world_size"),
        "nnodes": doc.get("nnodes", 1),
        "size_bytes": _number(doc.get("size_bytes")),
        "time_us": _number(doc.get("time_us")),
        "algbw_gbps": _number(doc.get("algbw_gbps")),
        "busbw_gbps": busbw,
        "link_peak_gbps": peak,
        "busbw_peak_fraction": busbw / peak if busbw is not None and peak else None,
        "wrong": doc.get("wrong"),
        "status": doc.get("status", "ok"),
        "error": doc.get("error"),
    }


def collective_table(documents: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per collective record, sorted by op, world size, scope and message size."""
    rows = [_row(doc) for doc in documents if doc.get("kind") == COLLECTIVE_KIND]
    table = pd.DataFrame(rows, columns=COLUMNS)
    keys = ["op", "world_size", "scope", "size_bytes"]
    return table.sort_values(keys, kind="stable", ignore_index=True)
