"""Analysis tables -> chart specs (``elements.Chart``), one chart per model unless stated.

Only selection and shaping happen here; the numbers come from ``torchscale.analysis``.
"""

from __future__ import annotations

import re
from typing import Iterator, List, Tuple

import numpy as np
import pandas as pd

from torchscale.analysis.scaling import EFFICIENCY_EXCELLENT, EFFICIENCY_GOOD
from torchscale.measures.figures import SYNC_OVERHEAD
from torchscale.report import device_words as words
from torchscale.report.elements import (
    BAND_EXCELLENT,
    BAND_GOOD,
    Band,
    Chart,
    Series,
)

MAX_BOXES = 24
"""Step-time boxes per chart; past this a model's chart is split per variant."""
MIB = 2**20
MEMORY_PARTS = [
    ("params_bytes", "parameters"),
    ("grads_bytes", "gradients"),
    ("optimizer_bytes", "optimizer state"),
    ("activations_peak_bytes", "activations"),
]


def cell_labels(frame: pd.DataFrame, with_model: bool = True) -> pd.Series:
    """``model · batch 32 · 4 GPUs`` (``· 8 GPUs × 2 nodes`` across nodes; ``· 2 CPU processes``
    on CPU) for each row (without the model inside a model's chart)."""
    label = (
        frame["variant"].astype(str)
        + " · "
        + frame["world_size"].map(lambda n: words.device(int(n)))
    )
    if "nnodes" in frame:
        nodes = frame["nnodes"].fillna(1).astype(int)
        label = label.where(nodes <= 1, label + " × " + nodes.astype(str) + " nodes")
    return frame["model"].astype(str) + " · " + label if with_model else label


def chart_id(*parts: object) -> str:
    return re.sub(r"[^a-z0-9]+", "-", "-".join(map(str, parts)).lower()).strip("-")


def _per_model(frame: pd.DataFrame) -> Iterator[Tuple[str, str, pd.DataFrame]]:
    for (experiment, model), group in frame.groupby(["experiment", "model"], sort=True):
        yield str(experiment), str(model), group


def chart_title(base: str, model: str, experiment: str, many: bool) -> str:
    return f"{base}: {model}" + (f" ({experiment})" if many else "")


def _gpu_ticks(frame: pd.DataFrame) -> List[int]:
    return sorted(int(v) for v in frame["world_size"].unique())


def ideal_throughput_label() -> str:
    return f"ideal (dashed): linear from the fewest {words.devices()}"


def efficiency_bands(top: float) -> List[Band]:
    """The seed's bands on a percent axis reaching ``top``: good > 80%, excellent > 90%."""
    return [
        Band(100 * EFFICIENCY_EXCELLENT, top, "excellent > 90%", BAND_EXCELLENT),
        Band(100 * EFFICIENCY_GOOD, 100 * EFFICIENCY_EXCELLENT, "good > 80%", BAND_GOOD),
    ]


def efficiency_top(efficiencies: pd.Series) -> float:
    """Where a percent axis of efficiencies (fractions) ends: 110%, or above the highest."""
    return max(110.0, float((100 * efficiencies).max()) + 5)


def efficiency_charts(curves: pd.DataFrame) -> List[Chart]:
    """Scaling efficiency, actual per variant against the ideal 100%, with the seed's bands."""
    charts = []
    many = curves["experiment"].nunique() > 1
    for experiment, model, group in _per_model(curves):
        ticks = _gpu_ticks(group)
        series = [
            Series(
                str(variant),
                rows["world_size"].tolist(),
                (100 * rows["scaling_efficiency"]).round(2).tolist(),
            )
            for variant, rows in group.groupby("variant", sort=True)
        ]
        series.insert(
            0, Series("ideal", [ticks[0], ticks[-1]], [100, 100], dashed=True, color_key="__ideal")
        )
        top = efficiency_top(group["scaling_efficiency"])
        charts.append(
            Chart(
                chart_id("efficiency", experiment, model),
                chart_title("Scaling efficiency", model, experiment, many),
                words.count_axis(),
                "scaling efficiency (%)",
                series,
                group[["model", "variant", "world_size", "throughput", "scaling_efficiency"]],
                x_ticks=ticks,
                bands=efficiency_bands(top),
                y_range=(0, top),
            )
        )
    return charts


def throughput_charts(curves: pd.DataFrame) -> List[Chart]:
    """Throughput against GPU count, with linear scaling from the smallest count dashed."""
    charts = []
    many = curves["experiment"].nunique() > 1
    for experiment, model, group in _per_model(curves):
        series = []
        for variant, rows in group.groupby("variant", sort=True):
            x = rows["world_size"].tolist()
            name = str(variant)
            series.append(Series(name, x, rows["throughput"].tolist(), color_key=name))
            series.append(
                Series(
                    f"{variant} (ideal)",
                    x,
                    rows["ideal_throughput"].tolist(),
                    color_key=str(variant),
                    dashed=True,
                    show_legend=False,
                )
            )
        # The dashed ideal lines take their variant's colour; one legend entry explains them all.
        series.append(
            Series(ideal_throughput_label(), [None], [None], dashed=True, color_key="__ideal")
        )
        unit = group["unit"].dropna().iloc[0] if group["unit"].notna().any() else "samples"
        charts.append(
            Chart(
                chart_id("throughput", experiment, model),
                chart_title("Throughput", model, experiment, many),
                words.count_axis(),
                f"{unit}/s (all {words.devices()})",
                series,
                group[["model", "variant", "world_size", "throughput", "ideal_throughput"]],
                x_ticks=_gpu_ticks(group),
            )
        )
    return charts


def step_time_charts(table: pd.DataFrame, samples: pd.DataFrame) -> List[Chart]:
    """Step-time distributions: one box per variant and GPU count (repeats pooled)."""
    cells = table[table["status"] == "ok"][
        ["cell_id", "experiment", "model", "variant", "world_size"]
    ]
    steps = samples.merge(cells, on="cell_id")
    steps["label"] = cell_labels(steps, with_model=False)
    charts = []
    many = steps["experiment"].nunique() > 1
    for experiment, model, group in _per_model(steps):
        groups = [(model, group)]
        if group["label"].nunique() > MAX_BOXES:
            groups = [(f"{model}, {v}", rows) for v, rows in group.groupby("variant", sort=True)]
        for name, rows in groups:
            rows = rows.sort_values(["variant", "world_size", "cell_id", "step"])
            labels = list(dict.fromkeys(rows["label"]))
            by_label = rows.groupby("label", sort=False)["step_ms"]
            boxes = [by_label.get_group(label).tolist() for label in labels]
            quantiles = by_label.quantile(np.array([0.95, 0.99])).unstack()
            charts.append(
                Chart(
                    chart_id("steps", experiment, name),
                    chart_title("Step time distribution", name, experiment, many),
                    "",
                    "step time (ms)",
                    [
                        Series("steps", labels, boxes, kind="box"),
                        Series("p95", labels, quantiles.loc[labels, 0.95].tolist(), kind="marker"),
                        Series("p99", labels, quantiles.loc[labels, 0.99].tolist(), kind="marker"),
                    ],
                    rows[["cell_id", "model", "variant", "world_size", "step", "step_ms"]],
                    x_type="category",
                    y_from_zero=False,
                )
            )
    return charts


def memory_charts(by_variant: pd.DataFrame) -> List[Chart]:
    """Memory per GPU (per rank on CPU) by configuration (``cells.memory_by_variant``), stacked by
    part."""
    joined = by_variant
    charts = []
    many = joined["experiment"].nunique() > 1
    for experiment, model, group in _per_model(joined):
        group = group.sort_values("variant")
        labels = group["variant"].tolist()
        series = [
            Series(name, labels, (group[key] / MIB).tolist(), kind="bar")
            for key, name in MEMORY_PARTS
            if group[key].notna().any()
        ]
        cuda = group["peak_kind"] == "cuda_allocated"
        if cuda.any():
            series.append(
                Series(
                    "peak allocated",
                    labels,
                    (group["peak_bytes"] / MIB).where(cuda).tolist(),
                    kind="marker",
                )
            )
        charts.append(
            Chart(
                chart_id("memory", experiment, model),
                chart_title(f"Memory {words.per_device()}", model, experiment, many),
                "",
                "MiB",
                series,
                group.drop(columns=["experiment"]),
                x_type="category",
                barmode="stack",
            )
        )
    return charts


def _gpu_line_chart(
    kind: str, title: str, y_title: str, group: pd.DataFrame, column: str, scale: float = 1.0
) -> Chart:
    """One line per variant of ``column`` (repeats averaged) against GPU count."""
    experiment, model = str(group["experiment"].iloc[0]), str(group["model"].iloc[0])
    means = group.groupby(["variant", "world_size"], as_index=False)[[column]].mean()
    series = [
        Series(str(variant), rows["world_size"].tolist(), (scale * rows[column]).tolist())
        for variant, rows in means.groupby("variant", sort=True)
    ]
    return Chart(
        chart_id(kind, experiment, model),
        title,
        words.count_axis(),
        y_title,
        series,
        means,
        x_ticks=_gpu_ticks(group),
    )


def utilisation_charts(table: pd.DataFrame) -> List[Chart]:
    """MFU against GPU count where the device's peak is known, else achieved TFLOP/s per GPU."""
    ok = table[(table["status"] == "ok") & table["tflops_per_gpu"].notna()]
    many = ok["experiment"].nunique() > 1
    charts = []
    for experiment, model, group in _per_model(ok):
        if group["mfu"].notna().any():
            title, y_title, column, scale = "Model FLOPs utilisation", "MFU (%)", "mfu", 100.0
        else:
            title, y_title, column, scale = (
                f"Achieved TFLOP/s {words.per_device()}",
                f"TFLOP/s {words.per_device()}",
                "tflops_per_gpu",
                1.0,
            )
        title = chart_title(title, model, experiment, many)
        charts.append(_gpu_line_chart("mfu", title, y_title, group, column, scale))
    return charts


def sync_share_charts(table: pd.DataFrame) -> List[Chart]:
    """Sync overhead (``docs/glossary.md``) against GPU count; cells of more than one rank."""
    ok = table[(table["status"] == "ok") & table["sync_overhead_pct"].notna()]
    ok = ok[ok["world_size"] > 1]
    many = ok["experiment"].nunique() > 1
    return [
        _gpu_line_chart(
            "sync-share",
            chart_title(SYNC_OVERHEAD.title, model, experiment, many),
            "% of step time",
            group,
            "sync_overhead_pct",
        )
        for experiment, model, group in _per_model(ok)
    ]


def rank_wait_charts(pooled_ranks: pd.DataFrame) -> List[Chart]:
    """Per-rank sync wait at each model's largest GPU count: the straggler waits least."""
    largest = pooled_ranks.groupby(["experiment", "model"])["world_size"].transform("max")
    joined = pooled_ranks[
        (pooled_ranks["world_size"] == largest) & pooled_ranks["sync_wait_ms"].notna()
    ]
    charts = []
    many = joined["experiment"].nunique() > 1
    for experiment, model, group in _per_model(joined):
        means = group.groupby(["variant", "rank"], as_index=False)[["sync_wait_ms"]].mean()
        series = [
            Series(
                str(variant),
                [f"rank {r}" for r in rows["rank"]],
                rows["sync_wait_ms"].tolist(),
                kind="bar",
            )
            for variant, rows in means.groupby("variant", sort=True)
        ]
        size = int(group["world_size"].iloc[0])
        charts.append(
            Chart(
                chart_id("rank-wait", experiment, model),
                chart_title(f"Sync wait per rank on {words.device(size)}", model, experiment, many),
                "",
                "sync wait per step (ms)",
                series,
                means,
                x_type="category",
            )
        )
    return charts


VERDICT_ORDER = ["regression", "not judged", "within noise", "unchanged", "improvement"]
VERDICT_COLORS = {
    "regression": "#D55E00",
    "not judged": "#CC79A7",
    "within noise": "#E69F00",
    "unchanged": "#9CA3AF",
    "improvement": "#009E73",
}
COMPARED = [
    # (metric, change column, interval columns, its verdict column, title, threshold's sign)
    ("throughput", "throughput_change_pct", "throughput_ci", "throughput_verdict",
     "Throughput change against the baseline", -1.0),
    ("p95", "p95_change_pct", "p95_ci", "p95_verdict",
     "p95 step time change against the baseline", 1.0),
]  # fmt: skip


def comparison_charts(cells: pd.DataFrame, threshold_pct: float) -> List[Chart]:
    """Per metric, its change per matched cell with its 95% interval, coloured by the verdict on
    that metric (the comparison's ``<metric>_verdict``; its cell ``verdict`` where it gives no
    per-metric one), against the threshold."""
    labels = cell_labels(cells).tolist()
    charts = []
    for metric, column, interval, verdict_column, title, sign in COMPARED:
        if column not in cells or not cells[column].notna().any():
            continue
        verdict = cells[verdict_column if verdict_column in cells else "verdict"]
        low, high = cells.get(f"{interval}_low_pct"), cells.get(f"{interval}_high_pct")
        series = [
            Series(
                name,
                labels,
                cells[column].where(verdict == name).tolist(),
                kind="bar",
                color_key=name,
                low=low.where(verdict == name).tolist() if low is not None else None,
                high=high.where(verdict == name).tolist() if high is not None else None,
            )
            for name in [*VERDICT_ORDER, *sorted(set(verdict) - set(VERDICT_ORDER))]
            if name in set(verdict)
        ]
        charts.append(
            Chart(
                f"comparison-{metric}",
                f"{title} (95% interval; colour: the verdict on it)",
                "",
                "change (%)",
                series,
                cells,
                x_type="category",
                hlines=[(sign * threshold_pct, f"{sign * threshold_pct:+g}% threshold")],
                barmode="overlay",
                colors_by_key=VERDICT_COLORS,
            )
        )
    return charts
