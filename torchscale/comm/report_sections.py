"""The communication kind's report pieces: the bandwidth section and its headline card, the
tensor-parallel GEMM cases and the P2P heatmaps. The report reaches them only through the kind
(``torchscale.comm.kind``, the report's ``ReportedKind`` protocol), built with the report's own
section builders.
"""

from __future__ import annotations

import math
from typing import List, Optional

import pandas as pd

from torchscale.analysis import iteration_breakdown as breakdown
from torchscale.measures.figures import ALGBW, BUSBW
from torchscale.measures.table_scalars import as_float, as_int
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import (
    Card,
    Chart,
    Column,
    Section,
    Series,
    Table,
    csv_data_uri,
    make_table,
)
from torchscale.report.sections import gpus_column, swept_columns
from torchscale.results.schema import ResultBase

HEAT_LEVELS = 10

# --- collectives ---------------------------------------------------------------------------------

REPORT_COLLECTIVE_COLUMNS = [
    "experiment", "op", "variant", "backend", "scope", "group_size", "dtype", "world_size",
    "nnodes", "size_bytes",
    "time_us", "algbw_gbps", "busbw_gbps", "link_peak_gbps", "busbw_peak_fraction", "wrong",
    "status", "error",
]  # fmt: skip


def report_collectives(collectives: pd.DataFrame) -> pd.DataFrame:
    """The collectives table (``torchscale.comm.result_tables``, which the communication kind
    passes in) as the report shows it: its columns, sorted by op, world size, scope and message
    size."""
    table = collectives.copy()
    # Records from before scopes ran over the world: their group is every rank.
    table["group_size"] = table["group_size"].fillna(table["world_size"])
    keys = ["op", "world_size", "variant", "scope", "dtype", "size_bytes"]
    shown = table[REPORT_COLLECTIVE_COLUMNS]
    return shown.sort_values(keys, kind="stable", ignore_index=True)


def communication_section(table: pd.DataFrame) -> Optional[Section]:
    """Bandwidth per collective, from the collectives table (the communication kind's report
    section)."""
    collectives = report_collectives(table)
    if collectives.empty:
        return None
    return Section(
        "communication",
        "Communication bandwidth",
        f"Collective bandwidth as nccl-tests defines it. {ALGBW.explained()} "
        f"{BUSBW.explained()} On several nodes, 'within nodes' runs each node's ranks alone and "
        "'across nodes' one rank per node: the network on its own.",
        charts=bandwidth_charts(collectives),
        tables=[
            make_table(
                "collective-table",
                collectives,
                [
                    Column("op", "Op", fmt.text, numeric=False),
                    *swept_columns(collectives),
                    gpus_column(),
                    Column("scope", "Scope", fmt.text, numeric=False),
                    Column("dtype", "dtype", fmt.text, numeric=False),
                    Column("size_bytes", "Size", fmt.human_bytes),
                    Column("time_us", "Time µs", fmt.significant),
                    Column("algbw_gbps", "algbw GB/s", fmt.significant),
                    Column("busbw_gbps", "busbw GB/s", fmt.significant),
                    Column("busbw_peak_fraction", "of peak", fmt.fraction),
                    Column("wrong", "Wrong", fmt.text),
                    Column("status", "Status", fmt.text, numeric=False),
                ],
            )
        ],
    )


SCOPE_LABELS = {"world": "", "intra_node": ", within nodes", "inter_node": ", across {n} nodes"}


def bandwidth_charts(collectives: pd.DataFrame) -> List[Chart]:
    """Bus bandwidth (solid) and algorithm bandwidth (dashed) against message size, per op; one
    line per GPU count x scope x dtype x configuration."""
    ok = collectives[(collectives["status"] == "ok") & collectives["busbw_gbps"].notna()]
    charts = []
    for op, group in ok.groupby("op", sort=True):
        series = []
        keys = ["world_size", "scope", "dtype", "variant"]
        dtypes = group["dtype"].nunique() > 1
        for (size, scope, dtype, variant), rows in group.groupby(keys, sort=True):
            name = words.device(as_int(size)) + SCOPE_LABELS.get(str(scope), f", {scope}").format(
                n=rows["group_size"].iloc[0]
            )
            # Every swept axis is in the series' name: a dtype or backend sweep never merges.
            name += (f", {dtype}" if dtypes else "") + (f", {variant}" if variant else "")
            x = rows["size_bytes"].tolist()
            series.append(Series(f"busbw, {name}", x, rows["busbw_gbps"].tolist(), color_key=name))
            series.append(
                Series(
                    f"algbw, {name}", x, rows["algbw_gbps"].tolist(), color_key=name, dashed=True
                )
            )
        peaks = group["link_peak_gbps"].dropna().unique()
        charts.append(
            Chart(
                chart_id("bandwidth", op),
                f"Bandwidth: {op}",
                "message size (bytes)",
                "GB/s",
                series,
                group.drop(columns=["experiment"]),
                x_type="log",
                hlines=[(float(p), f"link peak {p:g} GB/s") for p in peaks],
            )
        )
    return charts


PREFERRED_OP = "all_reduce"
"""The collective the bandwidth card quotes when it was measured (DDP's gradient sync)."""


def bandwidth_card(table: pd.DataFrame) -> Optional[Card]:
    """The headline card of a collectives table (the communication kind's): the highest bus
    bandwidth measured (all_reduce's when measured), with its link's share."""
    collectives = report_collectives(table)
    ok = collectives[(collectives["status"] == "ok") & collectives["busbw_gbps"].notna()]
    if ok.empty:
        return None
    preferred = ok[ok["op"] == PREFERRED_OP]
    best = (preferred if len(preferred) else ok).sort_values("busbw_gbps").iloc[-1]
    detail = (
        f"{fmt.human_bytes(best['size_bytes'])} messages on {words.device(int(best['world_size']))}"
    )
    if not pd.isna(best["busbw_peak_fraction"]):
        detail += f" · {fmt.fraction(best['busbw_peak_fraction'])} of the link's peak"
    return Card(f"Peak {BUSBW.name} ({best['op']}, GB/s)", fmt.significant(best["busbw_gbps"]),
                detail)  # fmt: skip


# --- tensor-parallel GEMM and P2P ---------------------------------------------------------------


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


def _sharded_columns(cases: pd.DataFrame) -> List[Column]:
    """The compute-only sharded GEMM (``tp_gemm.compute_only: [.., sharded]``), when measured."""
    if cases["sharded_us"].isna().all():
        return []
    return [
        Column("sharded_us", f"Compute only, sharded µs {words.per_device()}", fmt.significant),
        Column(
            "sharded_tflops", f"Compute only, sharded TFLOP/s {words.per_device()}", fmt.significant
        ),
    ]


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
                    *_sharded_columns(cases),
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
        "(compute only) and, where measured, each rank's own shard of it alone (compute only, "
        "sharded: no communication). The heatmap shades each ordered pair's send/recv bandwidth: "
        "a slow link shows as a pale cell.",
        charts=_tp_gemm_charts(cases) if not cases.empty else [],
        tables=tables,
    )
