"""The report's "Projected scaling" section: ``torchscale project`` at the next scales."""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from torchscale.analysis.report_tables import ProjectionTables
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import Chart, Column, Section, Series, make_table


def _charts(table: pd.DataFrame) -> List[Chart]:
    charts = []
    many = table["experiment"].nunique() > 1
    for (experiment, model), group in table.groupby(["experiment", "model"], sort=True):
        series = []
        for variant, rows in group.groupby("variant", sort=True):
            key = str(variant)
            series.append(
                Series(
                    f"{key} (predicted)",
                    rows["world_size"].tolist(),
                    rows["throughput"].tolist(),
                    color_key=key,
                )
            )
            for bound in ("low", "high"):
                series.append(
                    Series(
                        f"{key} ({bound})",
                        rows["world_size"].tolist(),
                        rows[f"throughput_{bound}"].tolist(),
                        color_key=key,
                        dashed=True,
                        show_legend=False,
                    )
                )
        unit = group["unit"].iloc[0]
        charts.append(
            Chart(
                chart_id("projection", experiment, model),
                f"Projected throughput — {model}" + (f" ({experiment})" if many else ""),
                words.count_axis(),
                f"{unit}/s (all {words.devices()})",
                series,
                group[
                    [
                        "experiment",
                        "model",
                        "variant",
                        "world_size",
                        "throughput",
                        "throughput_low",
                        "throughput_high",
                        "efficiency",
                    ]
                ],
                x_type="log",
                x_ticks=sorted(group["world_size"].unique().tolist()),
            )
        )
    return charts


def cpu_caveat() -> List[str]:
    """A projection from CPU processes extrapolates gloo over loopback, not a GPU fabric."""
    if not words.on_cpu():
        return []
    return [
        "Projected from gloo on CPU processes of one host: every row extrapolates CPU compute "
        "and loopback all-reduce, not GPUs or their interconnect."
    ]


def projection_section(
    projected: Optional[ProjectionTables], past_prediction_error: Optional[str]
) -> Optional[Section]:
    """None without training cells; a one-line note of what to add when a measurement is missing.
    ``past_prediction_error``: how far past predictions were off (the history's line), if known."""
    if projected is None:
        return None
    intro = (
        "Predicted from this run's own measurements: the compute-only step (no_sync probe), DDP's "
        "gradient buckets and overlap, and an alpha-beta model of ring and tree all-reduce fitted "
        "to the measured all_reduce curves (docs/projection.md). Bands are ±2 standard errors of "
        "the fit and of the reference step; they do not cover the model's own error."
    )
    if past_prediction_error:
        intro += f" {past_prediction_error}"
    result = projected.projection
    if result is None:
        missing = pd.DataFrame([{"missing": str(projected.missing)}])
        missing_table = make_table(
            "projection-missing",
            missing,
            [Column("missing", "Not projected: missing measurement", fmt.text, numeric=False)],
        )
        return Section("projection", "Projected scaling", intro, tables=[missing_table])
    table = result.table.copy()  # the "from" column is words, this report's
    for ref in result.references:
        mask = (
            (table["experiment"] == ref.experiment)
            & (table["model"] == ref.model)
            & (table["variant"] == ref.variant)
        )
        table.loc[mask, "from"] = words.device(ref.world_size)
    charts = _charts(table)
    for chart in charts:  # the measured points beside the predicted line
        for ref in result.references:
            first = chart.data.iloc[0]
            if (first["experiment"], first["model"]) != (ref.experiment, ref.model):
                continue
            xs = sorted(ref.measured)
            chart.series.append(
                Series(
                    f"{ref.variant} (measured)",
                    xs,
                    [ref.measured[x] for x in xs],
                    kind="marker",
                    color_key=ref.variant,
                )
            )
    band = table.apply(
        lambda r: (
            f"{fmt.significant(r['throughput_low'])} – {fmt.significant(r['throughput_high'])}"
        ),
        axis=1,
    )
    shown = table.assign(band=band)
    return Section(
        "projection",
        "Projected scaling",
        intro,
        charts=charts,
        tables=[
            make_table(
                "projection-table",
                shown,
                [
                    Column("model", "Model", fmt.text, numeric=False),
                    Column("variant", "Configuration", fmt.text, numeric=False),
                    Column("world_size", words.count_header(), fmt.integer),
                    Column("nodes", "Nodes", fmt.integer),
                    Column("from", "From", fmt.text, numeric=False),
                    Column("step_ms", "Step ms", fmt.significant),
                    Column(
                        "throughput", f"Throughput ({table['unit'].iloc[0]}/s)", fmt.significant
                    ),
                    Column("band", "Band (±2σ)", fmt.text),
                    Column("efficiency", "Efficiency", fmt.fraction),
                    Column("exposed_comm_ms", "Exposed communication ms", fmt.significant),
                    Column("algorithm", "All-reduce", fmt.text, numeric=False),
                ],
                csv_frame=table,
            )
        ],
        notes=[*cpu_caveat(), "Rests on: " + "; ".join(result.basis)],
    )
