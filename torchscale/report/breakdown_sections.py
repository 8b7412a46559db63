"""Report sections: communication vs computation per iteration and the step-time histogram
(seed 003), the tensor-parallel GEMM cases (seed 002) and the P2P bandwidth heatmap."""

from __future__ import annotations

import math
from typing import List, Optional

import pandas as pd

from torchscale.analysis import iteration_breakdown as breakdown
from torchscale.analysis.training_tables import training_table
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import (
    Chart,
    Column,
    Section,
    Series,
    Table,
    csv_data_uri,
    make_table,
)
from torchscale.results.figures import EXPOSED_COMMUNICATION
from torchscale.results.schema import ResultBase
from torchscale.results.table_scalars import as_float, as_int

MAX_BREAKDOWN_CHARTS = 6
HEAT_LEVELS = 10


def _breakdown_charts(table: pd.DataFrame) -> List[Chart]:
    """One stacked bar chart per cell (largest GPU counts first): each rank's compute, exposed
    communication and communication hidden behind compute, per iteration."""
    charts = []
    many = table["experiment"].nunique() > 1
    cells = table.groupby("cell_id", sort=False)["world_size"].first()
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


def comm_compute_section(records: List[ResultBase]) -> Optional[Section]:
    labelled = training_table(records)
    variants = dict(zip(labelled["cell_id"], labelled["variant"].astype(str)))
    table = breakdown.comm_compute_table(records, variants)
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


def tp_gemm_labels(rows: pd.DataFrame) -> List[str]:
    """Each case's bar label: m×n×k, then the dtype and the configuration when a sweep made
    several (``AG_before`` of ``backend=auto`` and of ``backend=gloo`` are two bars)."""
    labels = rows["case"].astype(str)
    if rows["dtype"].nunique() > 1:
        labels = labels + " " + rows["dtype"].astype(str)
    variant = rows["variant"].astype(str) if "variant" in rows else None
    if variant is not None and (variant != "").any():
        labels = labels + " · " + variant
    return labels.tolist()


def _tp_gemm_charts(cases: pd.DataFrame) -> List[Chart]:
    charts = []
    many = cases["experiment"].nunique() > 1
    for (experiment, world), rows in cases.groupby(["experiment", "world_size"], sort=True):
        x = tp_gemm_labels(rows)
        series = [
            Series("AG_before", x, rows["AG_before_us"].tolist(), kind="bar"),
            Series("AG_after", x, rows["AG_after_us"].tolist(), kind="bar"),
            Series("compute only (1 device)", x, rows["compute_only_us"].tolist(), kind="bar"),
        ]
        charts.append(
            Chart(
                chart_id("tp-gemm", experiment, world),
                f"Tensor-parallel GEMM on {words.device(as_int(world))}: "
                "all-gather before vs after the GEMM" + (f" ({experiment})" if many else ""),
                "m×n×k",
                "time per op (µs)",
                series,
                rows,
                x_type="category",
            )
        )
    return charts


def _heat(value: object, top: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or top <= 0:
        return "heat-none"
    return f"heat-{min(HEAT_LEVELS - 1, int(as_float(value) / top * HEAT_LEVELS))}"


def p2p_heatmap(matrix: pd.DataFrame) -> Table:
    """A rank x rank table whose cells are shaded by bandwidth (darker = faster)."""
    values = [v for row in matrix.to_numpy().tolist() for v in row if v is not None]
    top = max((float(v) for v in values if not math.isnan(float(v))), default=0.0)
    rows = []
    for source, row in matrix.iterrows():
        cells = [(str(source), "")]
        cells += [(fmt.significant(v), _heat(v, top)) for v in row.tolist()]
        rows.append(cells)
    headers = [("src \\ dst (GB/s)", False)] + [(str(c), True) for c in matrix.columns]
    attrs = matrix.attrs
    slowest = attrs.get("slowest_pair")
    caption = (
        f"{words.device(int(attrs.get('world_size') or 0))}, "
        f"{fmt.human_bytes(int(attrs.get('size_bytes') or 0))} "
        f"{attrs.get('dtype')} messages, busbw per ordered pair"
        + (f"; slowest pair rank {slowest[0]} → rank {slowest[1]}" if slowest else "")
    )
    frame = matrix.reset_index(names="src")
    variant = attrs.get("variant") or ""
    if variant:
        caption += f" ({variant})"
    table_id = chart_id("p2p-heatmap", attrs.get("world_size"), attrs.get("dtype"), variant)
    widths = [100 / (len(headers))] * len(headers)
    return Table(table_id, headers, rows, csv_data_uri(frame), caption, widths)


def parallelism_section(records: List[ResultBase]) -> Optional[Section]:
    """The TP GEMM charts and the P2P heatmaps, when the communication cells measured them."""
    cases = breakdown.tp_gemm_cases(records)
    matrices = breakdown.p2p_matrices(records)
    if cases.empty and not matrices:
        return None
    tables = [p2p_heatmap(m) for m in matrices]
    if not cases.empty:
        us = fmt.significant
        tables.append(
            make_table(
                "tp-gemm-table",
                cases,
                [
                    Column("world_size", words.count_header(), fmt.integer),
                    *(
                        [Column("variant", "Configuration", fmt.text, numeric=False)]
                        if (cases["variant"].astype(str) != "").any()
                        else []
                    ),
                    Column("case", "m×n×k", fmt.text, numeric=False),
                    Column("dtype", "dtype", fmt.text, numeric=False),
                    Column("AG_before_us", "AG_before µs", us),
                    Column("AG_after_us", "AG_after µs", us),
                    Column("compute_only_us", "Compute only µs", us),
                    Column("AG_before_tflops", "AG_before TFLOP/s", us),
                    Column("AG_after_tflops", "AG_after TFLOP/s", us),
                ],
            )
        )
    return Section(
        "parallelism",
        "Tensor-parallel GEMM and point-to-point bandwidth",
        "DDLB's column-wise tensor-parallel GEMM: all-gather A then one GEMM (AG_before) or GEMM "
        "on the shard then all-gather C (AG_after), against the same GEMM unsharded on one device "
        "(compute only). The heatmap shades each ordered pair's send/recv bandwidth: a slow link "
        "shows as a pale cell.",
        charts=_tp_gemm_charts(cases) if not cases.empty else [],
        tables=tables,
    )
