"""Decoded Kineto columns -> a :class:`RankTrace`, with HTA's load-time rules.

The parts a trace was decoded in (one per block range) are joined one column at a time, the parts
emptied as they go (a large trace's columns are never held twice); invalid events are counted and
left out; ns-resolution times are rounded as HTA rounds them; each GPU row is linked to the call
that launched it; and, as HTA's ``TraceAnalysis`` does, what was launched at or after the start of
the last ``ProfilerStep`` is dropped. See ``kineto`` for the reading and ``model`` for the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.traces import kineto_decode as dec
from torchscale.profiling.traces.model import (
    RankTrace,
    api_table,
    compact_floats,
    compact_ints,
    invalid_memory_rows,
    invalid_rows,
    keep_rows,
    link_launches,
    memory_table,
    names_matching,
    split_rows,
    table,
)

INT_COLUMNS = ("pid", "tid", "stream", "correlation")


def _name_maps(
    parts: List[dec.Columns], names: Optional[Dict[str, int]] = None
) -> List[np.ndarray]:
    """Per part, its name codes -> codes into the names of all parts (in first-seen order)."""
    names = {} if names is None else names
    return [
        np.fromiter((names.setdefault(n, len(names)) for n in p.names), np.int32, len(p.names))
        for p in parts
    ]


def _joined(arrays: List[np.ndarray], dtype: Any = np.float64) -> np.ndarray:
    if not arrays:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]


def _merge(
    parts: List[dec.Columns],
) -> Tuple[Dict[str, np.ndarray], List[str], List[str], Dict[str, object]]:
    """The parts' columns joined, one column at a time; the parts are emptied as they go (a
    large trace's columns are never held twice)."""
    names: Dict[str, int] = {}
    cats: Dict[str, int] = {}
    meta: Dict[str, object] = {}
    name_maps, cat_maps = _name_maps(parts, names), []
    for part in parts:
        cat_maps.append(
            np.fromiter(
                (cats.setdefault(c, len(cats)) for c in part.cats), np.int32, len(part.cats)
            )
        )
        meta.update(part.metadata)

    def joined(field: str, dtype: Any, maps: Optional[List[np.ndarray]] = None) -> np.ndarray:
        arrays: List[np.ndarray] = []
        for i, part in enumerate(parts):
            column = getattr(part, field).take()
            arrays.append(column if maps is None else compact_ints(maps[i][column]))
            del column
        return _joined(arrays, dtype)

    cols = {"ts": joined("ts", np.float64), "dur": joined("dur", np.float64)}
    cols.update({f: joined(f, np.int64) for f in INT_COLUMNS})
    cols["name"] = joined("name_codes", np.int32, name_maps)
    cols["cat"] = joined("cat_codes", np.int32, cat_maps)
    return cols, list(names), list(cats), meta


def _round_like_hta(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """HTA's rounding of ns-resolution times, in place on ``ts``: start up, end down; returns
    the durations."""
    end = ts + dur
    np.floor(end, out=end)
    np.ceil(ts, out=ts)
    np.subtract(end, ts, out=end)
    return compact_floats(end)


PROFILER_STEP = "ProfilerStep"  # torch.profiler's step ranges: ProfilerStep#N


def last_step_start(cpu: pd.DataFrame) -> Optional[float]:
    """Where HTA's rule (applied by :func:`finish`) ends the analysed window of a trace read
    whole: the start of the last ``ProfilerStep`` when there are two or more, else None."""
    steps = cpu[names_matching(cpu["name"], lambda name: PROFILER_STEP in name)]
    if steps["name"].nunique() < 2:
        return None
    return float(steps["ts"].max())


def finish(path: Path, parts: List[dec.Columns], trim_last_step: bool = True) -> RankTrace:
    """Columns -> a RankTrace with HTA's load-time rules applied; invalid events counted.

    ``trim_last_step``: drop what was launched at or after the start of the last ProfilerStep,
    as HTA's ``TraceAnalysis`` does (its ``TraceDiff`` keeps it)."""
    decoded = sum(p.events for p in parts)
    maps = _name_maps(parts)
    api = {
        "correlation": _joined([p.api_correlation.take() for p in parts], np.int64),
        "ts": _joined([p.api_ts.take() for p in parts]),
        "dur": _joined([p.api_dur.take() for p in parts]),
        "name": _joined(
            [compact_ints(maps[i][p.api_name.take()]) for i, p in enumerate(parts)],
            np.int32,
        ),
    }
    memory = {key: _joined([p.memory[key].take() for p in parts]) for key in dec.MEMORY_FIELDS}
    memory_bad, memory_invalid = invalid_memory_rows(memory)
    keep_rows(memory, ~memory_bad)
    cols, names, cats, meta = _merge(parts)
    cat_names = np.asarray([*cats, ""], dtype=object)
    bad, invalid = invalid_rows(cols["ts"], cols["dur"])
    invalid.update(memory_invalid)
    keep_rows(cols, ~bad & (cat_names[cols["cat"]] != ""))  # HTA drops events without a category
    api_bad, _ = invalid_rows(api["ts"], api["dur"])
    keep_rows(api, ~api_bad)
    del bad, api_bad
    ts, api_ts = cols["ts"], api["ts"]
    fractional = bool(np.any(ts != np.floor(ts))) or bool(np.any(api_ts != np.floor(api_ts)))
    del ts, api_ts
    if fractional:  # ns-resolution trace: HTA rounds start up, end down
        cols["dur"] = _round_like_hta(cols["ts"], cols["dur"])
        api["dur"] = _round_like_hta(api["ts"], api["dur"])
    gpu_cols, cpu_cols = split_rows(cols)
    gpu_cols["launch_ts"], gpu_cols["launch_dur"], gpu_cols["launcher"] = link_launches(
        gpu_cols, cpu_cols, api
    )
    del api["correlation"]
    step_codes = [i for i, n in enumerate(names) if PROFILER_STEP in n]
    window_end = None
    steps = np.isin(cpu_cols["name"], step_codes)
    # Steps counted among the valid events only: a step left out as invalid neither ends the
    # window nor makes the one valid step the "last" (which would leave nothing before it).
    if trim_last_step and len(np.unique(cpu_cols["name"][steps])) >= 2:
        window_end = float(cpu_cols["ts"][steps].max())
    del steps
    if window_end is not None:
        # a kernel counts by its launch (HTA's rule), anything else by its start
        is_kernel = gpu_cols["correlation"] >= 0
        anchor = np.where(is_kernel, gpu_cols["launch_ts"], gpu_cols["ts"])
        del is_kernel
        keep_rows(gpu_cols, anchor < window_end)
        del anchor
        keep_rows(cpu_cols, cpu_cols["ts"] < window_end)
        keep_rows(api, api["ts"] < window_end)
        keep_rows(memory, memory["ts"] < window_end)
    info = meta.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info, dict) else None
    metadata: Dict[str, object] = {
        "distributedInfo": info,
        "baseTimeNanoseconds": meta.get("baseTimeNanoseconds"),
        "decoded_events": decoded,
    }
    gpu, cpu = table(gpu_cols, cats, names), table(cpu_cols, cats, names)
    return RankTrace(
        rank=rank if isinstance(rank, int) else -1,
        path=path,
        source="kineto",
        gpu=gpu,
        cpu=cpu,
        metadata=metadata,
        window_end=window_end,
        invalid=invalid,
        api=api_table(api, names),
        memory=memory_table(memory),
    )
