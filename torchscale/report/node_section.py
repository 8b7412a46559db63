"""The "Scaling across nodes" section: scaling efficiency split into intra- and inter-node parts.

Shown only when the results hold a measured multi-node cell. Every figure is
:func:`torchscale.analysis.node_scaling.node_scaling`'s, computed per experiment (a cell of one
run is never another run's baseline): a table per configuration x node count x GPUs per node, a
chart per configuration, and a headline for the summary.
"""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from torchscale.measures.figures import SCALING_EFFICIENCY
from torchscale.report import charts, sections
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.elements import Chart, Column, Section, Series, make_table

FACTORS = [
    ("scaling_efficiency", "total"),
    ("intra_node_efficiency", "intra-node"),
    ("inter_node_efficiency", "inter-node"),
]
CHART_COLUMNS = [
    "model", "variant", "nnodes", "nproc_per_node", "world_size", "samples_per_s",
    "scaling_efficiency", "intra_node_efficiency", "inter_node_efficiency",
]  # fmt: skip


def shape_title() -> str:
    return f"nodes × {words.devices()} per node"


def shape_label(nnodes: int, per_node: int) -> str:
    """``2 × 8``: nodes times GPUs (ranks) per node."""
    return f"{int(nnodes)} × {int(per_node)}"


def shape_labels(frame: pd.DataFrame) -> List[str]:
    return [shape_label(n, g) for n, g in zip(frame["nnodes"], frame["nproc_per_node"])]


def _multinode(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["nnodes"] > 1]


def node_charts(rows: pd.DataFrame) -> List[Chart]:
    """Per configuration: total, intra- and inter-node efficiency for each node count, as grouped
    bars over the one-node cell and the multi-node cells with the same GPUs per node. A
    configuration none of whose multi-node cells can be split gets no chart (the table says why)."""
    many = rows["experiment"].nunique() > 1
    found: List[Chart] = []
    for (experiment, _), group in rows.groupby(["experiment", "config_key"], sort=False):
        spread = set(_multinode(group)["nproc_per_node"])
        if not spread:
            continue
        shown = group[group["nproc_per_node"].isin(spread)]
        if _multinode(shown)["inter_node_efficiency"].isna().all():
            continue
        shown = shown.sort_values(["nproc_per_node", "nnodes"])
        labels = shape_labels(shown)
        series = [
            Series(name, labels, (100 * shown[column]).round(2).tolist(), kind="bar")
            for column, name in FACTORS
        ]
        top = charts.efficiency_top(pd.concat([shown[column] for column, _ in FACTORS]))
        name = f"{shown['model'].iloc[0]} · {shown['variant'].iloc[0]}"
        chart_id = charts.chart_id("nodes", experiment, name)
        if any(chart.chart_id == chart_id for chart in found):  # knobs the label leaves out
            chart_id += f"-{len(found)}"
        found.append(
            Chart(
                chart_id,
                charts.chart_title("Efficiency across nodes", name, str(experiment), many),
                shape_title(),
                "efficiency (%)",
                series,
                shown[CHART_COLUMNS],
                x_type="category",
                bands=charts.efficiency_bands(top),
                y_range=(0, top),
            )
        )
    return found


def _missing_note(rows: pd.DataFrame) -> List[str]:
    unsplit = _multinode(rows)
    unsplit = unsplit[unsplit["inter_node_efficiency"].isna()]
    if unsplit.empty:
        return []
    needed = ", ".join(shape_label(1, g) for g in sorted(set(unsplit["nproc_per_node"])))
    return [
        f"A {fmt.MISSING} under Intra-node and Inter-node: the split needs the one-node cell with "
        f"the same {words.devices()} per node ({needed}), not measured for that configuration "
        "(which then has "
        "no chart here). Measure a full node (gpu_counts that include gpus_per_node) or use "
        "nodes: [1, 2]."
    ]


def node_section(rows: pd.DataFrame) -> Optional[Section]:
    """None for single-node results."""
    if _multinode(rows).empty:
        return None
    shown = rows.assign(shape=shape_labels(rows))
    identity = ["experiment", "model", "batch_size", "precision", "nnodes", "nproc_per_node"]
    variant = [sections.VARIANT] if shown.duplicated(identity).any() else []
    return Section(
        "nodes",
        "Scaling across nodes",
        f"Scaling efficiency on K nodes of G {words.devices()} = intra-node × inter-node "
        "efficiency. Intra-node is the scaling efficiency of the one-node cell of G; inter-node is "
        "the throughput over "
        "K times that cell's throughput: what the network between the nodes costs. Bands: good "
        "above 80%, excellent above 90%. Repeated runs are averaged.",
        charts=node_charts(rows),
        tables=[
            make_table(
                "nodes-table",
                shown,
                [
                    *sections.experiment_columns(shown),
                    sections.MODEL,
                    *variant,
                    Column("batch_size", "Batch", fmt.integer),
                    Column("precision", "Precision", fmt.text, numeric=False),
                    Column("shape", f"Nodes × {words.devices()}/node", fmt.text),
                    sections.gpus_column(),
                    *sections.throughput_columns(shown),
                    Column("scaling_efficiency", SCALING_EFFICIENCY.title, fmt.fraction),
                    Column("intra_node_efficiency", "Intra-node", fmt.fraction),
                    Column("inter_node_efficiency", "Inter-node", fmt.fraction),
                    Column("hosts", "Hosts", fmt.text, numeric=False),
                ],
                row_class=sections.band_class,
                csv_frame=rows.drop(columns=["config_key", "band"]),
            )
        ],
        notes=_missing_note(rows),
    )


def node_headline(rows: pd.DataFrame) -> Optional[str]:
    """The summary's line on the largest multi-node GPU count; with several configurations there,
    the one that loses most across nodes. None for single-node results."""
    multi = _multinode(rows)
    if multi.empty:
        return None
    largest = multi[multi["world_size"] == multi["world_size"].max()]
    pick = largest.sort_values(["inter_node_efficiency", "scaling_efficiency"]).iloc[0]
    gpus, per_node = int(pick["world_size"]), int(pick["nproc_per_node"])
    line = (
        f"Across nodes: {words.device(gpus)} ({shape_label(pick['nnodes'], per_node)}) at "
        f"{fmt.fraction(pick['scaling_efficiency'])}"
    )
    if pd.isna(pick["inter_node_efficiency"]):
        line += f"; the split needs the one-node cell of {words.device(per_node)}"
    else:
        line += (
            f" = {fmt.fraction(pick['intra_node_efficiency'])} within the node × "
            f"{fmt.fraction(pick['inter_node_efficiency'])} across nodes"
        )
    where = [f"{pick['model']} · {pick['variant']}"]
    if rows["experiment"].nunique() > 1:
        where.append(str(pick["experiment"]))
    if len(largest) > 1:
        where.append(f"the lowest across nodes of {len(largest)} at {words.device(gpus)}")
    return f"{line} ({', '.join(where)})."
