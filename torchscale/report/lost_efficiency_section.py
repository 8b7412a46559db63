"""The report's lost-efficiency section: for each configuration and GPU count, the gap between
ideal and measured scaling split into exposed communication, straggler wait, input pipeline,
interference and the rest (``analysis/lost_efficiency.py`` computes it)."""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from torchscale.analysis.lost_efficiency import CAUSES, PARTS
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import (
    BAND_NOISE as NOISE_COLOR,
)
from torchscale.report.elements import (
    Band,
    Chart,
    Column,
    Section,
    Series,
    make_table,
)

LABELS = {
    "exposed_comm": "exposed communication",
    "straggler_wait": "straggler wait",
    "input_pipeline": "input pipeline",
    "interference": "interference",
    "other": "other",
}


NOISE = "noise"


def _points(value: object) -> str:
    return fmt.significant(value)


def _part(value: object) -> str:
    """A part of the gap; one below zero is noise, and says so."""
    text = fmt.significant(value)
    if isinstance(value, (int, float)) and value < 0:
        return f"{text} ({NOISE})"
    return text


def noise_band(rows: pd.DataFrame) -> Optional[Band]:
    """The run-to-run noise band of a chart's parts (its widest row's), from zero up: a part
    under it, or below zero, is noise."""
    widest = rows["noise_pts"].max()
    if pd.isna(widest) or widest <= 0:
        return None
    return Band(0.0, float(widest), f"{NOISE} band (±{fmt.significant(widest)} pts)", NOISE_COLOR)


def _charts(table: pd.DataFrame) -> List[Chart]:
    charts = []
    many = table["experiment"].nunique() > 1
    for (experiment, model), rows in table.groupby(["experiment", "model"], sort=True):
        x = [f"{v}, {words.device(int(g))}" for v, g in zip(rows["variant"], rows["world_size"])]
        # A part below zero is noise (analysis/lost_efficiency.py): no bar goes below the axis;
        # the table gives its value, marked as noise, and the band shows the noise's size.
        series = [
            Series(LABELS[c], x, rows[f"{c}_pts"].fillna(0.0).clip(lower=0.0).tolist(), kind="bar")
            for c in PARTS
        ]
        # Without the noise below zero the bars may stand above the gap: the gap is marked.
        series.append(Series("measured gap", x, rows["gap_pts"].tolist(), kind="marker"))
        band = noise_band(rows)
        charts.append(
            Chart(
                chart_id("lost-efficiency", experiment, model),
                f"Efficiency lost, by cause — {model}" + (f" ({experiment})" if many else ""),
                "configuration",
                "points of scaling efficiency lost",
                series,
                rows[["variant", "world_size", "gap_pts", *[f"{c}_pts" for c in CAUSES]]],
                x_type="category",
                barmode="stack",
                bands=[band] if band else [],
            )
        )
    return charts


def lost_efficiency_section(table: pd.DataFrame) -> Optional[Section]:
    """``table``: each scaled cell's gap to ideal scaling, split by cause."""
    if table.empty:
        return None
    pts = [Column(f"{c}_pts", f"{LABELS[c].capitalize()} (pts)", _part) for c in CAUSES]
    return Section(
        "lost-efficiency",
        "Where the efficiency goes",
        "The gap between ideal and measured scaling, in points of efficiency, split by cause: "
        "each is how much a part of every rank's step changed from the baseline count of "
        f"{words.devices()} (exposed communication: the sync wait of the rank that waits least; "
        "straggler wait: the other ranks' extra wait for it; input pipeline: the wait for "
        "batches; interference: the same compute running slower), divided by the step time. "
        "Other is what the measured gap leaves: the columns add up to it. A part below zero "
        "(a cause that seems to have given efficiency back) is noise: it is marked so in the "
        "table and drawn as no bar, so the bars may stand above the measured gap (the marker); "
        "the shaded band is the run-to-run noise of a part (95%, from the step times' spread at "
        "both counts), and a part under it is no larger than that noise.",
        charts=_charts(table),
        tables=[
            make_table(
                "lost-efficiency-table",
                table,
                [
                    Column("model", "Model", fmt.text, numeric=False),
                    Column("variant", "Configuration", fmt.text, numeric=False),
                    Column("world_size", words.count_header(), fmt.integer),
                    Column("scaling_efficiency", "Efficiency", fmt.fraction),
                    Column("gap_pts", "Gap (pts)", _points),
                    *pts,
                    Column("other_pts", "Other (pts)", _part),
                    Column("noise_pts", "Noise band (± pts)", _points),
                    Column("step_ms", "Step (ms)", fmt.significant),
                    Column("baseline_step_ms", "Baseline step (ms)", fmt.significant),
                ],
                csv_frame=table,
                csv_note="the CSV holds each cause in ms per step too",
            )
        ],
    )
