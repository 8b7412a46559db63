"""The report's "Profiles" section: every traced cell (``analysis.profiled_cells``' table) with
how its figures relate (``SYNC_RELATION``)."""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from torchscale.analysis.profiled_cells import PROFILE_RUN
from torchscale.measures.figures import SYNC_OVERHEAD, SYNC_RELATION, SYNC_STALL
from torchscale.measures.table_scalars import as_int, frame_records
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.elements import Column, Section, make_table


def relation_lines(table: pd.DataFrame) -> List[str]:
    """For each profile run with both figures: its sync stall beside the sync overhead the
    benchmark measured for the same configuration, and how they relate."""
    lines = []
    runs = table[table["traced_by"] == PROFILE_RUN]
    for row in frame_records(runs):
        stall, own = row[SYNC_STALL.column], row["sync_overhead_pct"]
        benchmark = row["benchmark_sync_overhead_pct"]
        if pd.isna(stall) or (pd.isna(benchmark) and pd.isna(own)):
            continue
        overhead = (
            f"the benchmark measured a {SYNC_OVERHEAD.name} of {fmt.percent(benchmark)} "
            f"(the profile run's own window: {fmt.percent(own)})"
            if not pd.isna(benchmark)
            else f"the profile run measured a {SYNC_OVERHEAD.name} of {fmt.percent(own)}"
        )
        lines.append(
            f"{row['model']} · batch {row['batch_size']} on "
            f"{words.device(as_int(row['world_size']))}: {overhead}; its trace a "
            f"{SYNC_STALL.name} of {fmt.percent(stall)}."
        )
    return lines


def _traced_by(table: pd.DataFrame) -> List[str]:
    """``torchscale profile (torch)``: what traced the cell, and with which tool."""
    return [
        f"{by} ({tool})" if isinstance(tool, str) else str(by)
        for by, tool in zip(table["traced_by"], table["tool"])
    ]


def profile_section(table: pd.DataFrame) -> Optional[Section]:
    """``table``: every traced cell (``analysis.profiled_cells.profile_table``)."""
    if table.empty:
        return None
    several = table["experiment"].nunique() > 1
    experiment = [Column("experiment", "Experiment", fmt.text, numeric=False)] if several else []
    return Section(
        "profiles",
        "Profiles",
        "Every traced cell: the benchmark's own profiled cells and the `torchscale profile` runs "
        f"written into the experiment's folder (the profile of that experiment). "
        f"{SYNC_STALL.explained()} {SYNC_RELATION}",
        tables=[
            make_table(
                "profile-table",
                table.assign(traced=_traced_by(table)),
                [
                    *experiment,
                    Column("model", "Model", fmt.text, numeric=False),
                    Column("batch_size", "Batch", fmt.integer),
                    Column("world_size", words.count_header(), fmt.integer),
                    Column("traced", "Traced by", fmt.text, numeric=False),
                    Column("steps", "Steps traced", fmt.integer),
                    Column("sync_overhead_pct", f"{SYNC_OVERHEAD.title} %", fmt.percent),
                    Column(SYNC_STALL.column, f"{SYNC_STALL.title} %", fmt.percent),
                    Column("findings", "Findings", fmt.integer),
                    Column("folder", "Traces", fmt.text, numeric=False),
                ],
            )
        ],
        notes=relation_lines(table),
    )
