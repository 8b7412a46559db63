"""Report sections: communication vs computation per iteration and the step-time histogram
(the Distributed Training Profiler's). The communication kind's TP GEMM cases and P2P heatmaps
are its own (``torchscale.comm.report_sections``)."""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from torchscale.measures.figures import EXPOSED_COMMUNICATION
from torchscale.measures.table_scalars import as_int
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import (
    Chart,
    Column,
    Section,
    Series,
    make_table,
)

MAX_BREAKDOWN_CHARTS = 6


def _breakdown_charts(table: pd.DataFrame) -> List[Chart]:
    """One stacked bar chart per cell (largest GPU counts first): each rank's compute, exposed
    communication and communication hidden behind compute, per iteration."""
    charts = []
    many = table["experiment"].nunique() > 1
    # One rank has no communication: its cell has no communication chart (compute alone is the
    # step-time sections' business).
    cells = table[table["world_size"] > 1].groupby("cell_id", sort=False)["world_size"].first()
    for cell_id in cells.sort_values(ascending=False).index[:MAX_BREAKDOWN_CHARTS]:
        rows = table[table["cell_id"] == cell_id]
        x = [f"rank {int(r)}" for r in rows["rank"]]
        series = [
            Series("compute", x, rows["compute_ms"].tolist(), kind="bar"),
            Series("exposed communication", x, rows["exposed_comm_ms"].tolist(), kind="bar"),
            Series("communication, overlapped", x, rows["overlap_ms"].tolist(), kind="bar"),
        ]
        first = rows.iloc[0]
        charts.append(
            Chart(
                chart_id("comm-compute", cell_id),
                f"Communication vs computation per iteration — {first['model']}, "
                f"{first['variant'] or 'batch ' + str(first['batch_size'])}, "
                f"{words.device(int(first['world_size']))}"
                + (f" ({first['experiment']})" if many else ""),
                "rank",
                "ms per iteration (DDP logging)",
                series,
                rows[["rank", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms"]],
                x_type="category",
                barmode="stack",
            )
        )
    return charts


def comm_compute_section(table: pd.DataFrame) -> Optional[Section]:
    """``table``: each traced rank's compute and communication per iteration."""
    if table.empty:
        return None
    ms = fmt.significant
    return Section(
        "comm-compute",
        "Communication vs computation",
        "Per iteration and rank, from DDP's own logging data (its probe window, every step): "
        "forward plus backward compute, the gradient all-reduce time, and the part of it that ran "
        f"while backward was still computing (overlapped). {EXPOSED_COMMUNICATION.explained()}",
        charts=_breakdown_charts(table),
        tables=[
            make_table(
                "comm-compute-table",
                table,
                [
                    Column("model", "Model", fmt.text, numeric=False),
                    Column("variant", "Configuration", fmt.text, numeric=False),
                    Column("world_size", words.count_header(), fmt.integer),
                    Column("rank", "Rank", fmt.integer),
                    Column("compute_ms", "Compute ms", ms),
                    Column("comm_ms", "Comm ms", ms),
                    Column("overlap_ms", "Overlapped ms", ms),
                    Column("exposed_comm_ms", "Exposed communication ms", ms),
                    Column("comm_compute_ratio", "Comm / compute", fmt.fraction),
                    Column("exposed_share", "Exposed communication % of step", fmt.fraction),
                ],
            )
        ],
    )


def histogram_charts(histogram: pd.DataFrame) -> List[Chart]:
    """Step-time histogram per configuration, one bar series per GPU count."""
    charts = []
    many = histogram["experiment"].nunique() > 1
    for (experiment, model, variant), group in histogram.groupby(
        ["experiment", "model", "variant"], sort=True, observed=True
    ):
        series = []
        for world, rows in group.groupby("world_size", sort=True):
            labels = [f"{fmt.significant(m)}" for m in rows["bin_mid_ms"]]
            series.append(
                Series(words.device(as_int(world)), labels, rows["steps"].tolist(), kind="bar")
            )
        charts.append(
            Chart(
                chart_id("latency-histogram", experiment, model, variant),
                f"Step-time histogram — {model}, {variant}" + (f" ({experiment})" if many else ""),
                "step time (ms, bin centre)",
                "steps",
                series,
                group.drop(columns=["experiment"]),
                x_type="category",
            )
        )
    return charts
