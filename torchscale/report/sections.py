"""The report's chart-and-table sections, each from the analysis tables of the loaded results."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pandas as pd

from torchscale.analysis.comparison import Comparison
from torchscale.measures.figures import (
    GPU_MEMORY_UTILISATION,
    SCALING_EFFICIENCY,
    SYNC_OVERHEAD,
    SYNC_WAIT,
)
from torchscale.report import charts
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.elements import Column, Section, Table, make_table

EXPERIMENT = Column("experiment", "Experiment", fmt.text, numeric=False)
MODEL = Column("model", "Model", fmt.text, numeric=False)
VARIANT = Column("variant", "Configuration", fmt.text, numeric=False)


def gpus_column() -> Column:
    """The rank count: ``GPUs``, or ``Ranks`` for CPU processes."""
    return Column("world_size", words.count_header(), fmt.integer)


def experiment_columns(frame: pd.DataFrame) -> List[Column]:
    """The experiment column, when the report covers several."""
    several = "experiment" in frame and frame["experiment"].nunique() > 1
    return [EXPERIMENT] if several else []


def cell_columns(frame: pd.DataFrame) -> List[Column]:
    """Model, configuration and GPU count (after the experiment when there are several)."""
    return [*experiment_columns(frame), MODEL, VARIANT, gpus_column()]


def swept_columns(frame: pd.DataFrame) -> List[Column]:
    """The configuration column of a communication table, when a sweep made several
    (``analysis.scaling.configuration_variants``)."""
    several = "variant" in frame and (frame["variant"].astype(str) != "").any()
    return [VARIANT] if several else []


def band_class(row: Dict[str, Any]) -> str:
    """A row's scaling band (its ``band``, from the analysis) as the row's class."""
    return f"band-{row['band']}"


def throughput_columns(frame: pd.DataFrame, key: str = "throughput") -> List[Column]:
    """Throughput with its unit in the header when every row shares one, else a Unit column."""
    units = frame["unit"].dropna().unique()
    if len(units) == 1:
        return [Column(key, f"Throughput ({units[0]}/s)", fmt.significant)]
    return [
        Column(key, "Throughput /s", fmt.significant),
        Column("unit", "Unit", fmt.text, numeric=False),
    ]


def scaling_section(curves: pd.DataFrame) -> Section:
    """``curves``: the scaling curves, each row with its ``band``."""
    rows = curves
    runs = [Column("repeats", "Runs", fmt.integer)] if (rows["repeats"] > 1).any() else []
    return Section(
        "scaling",
        "Scaling",
        f"Scaling efficiency is throughput on N {words.devices()} over N/B times the throughput "
        f"on B, the smallest count measured for the same configuration (B = 1 when a cell on "
        f"one {words.device()} exists); a configuration measured at one count has none (–). "
        "Bands: good above 80%, excellent above 90%. Repeated runs are averaged.",
        charts=charts.efficiency_charts(curves) + charts.throughput_charts(curves),
        tables=[
            make_table(
                "scaling-table",
                rows,
                [
                    *cell_columns(rows),
                    *throughput_columns(rows),
                    Column("ideal_throughput", "Ideal", fmt.significant),
                    Column("scaling_efficiency", SCALING_EFFICIENCY.title, fmt.fraction),
                    Column("band", "Band", fmt.text, numeric=False),
                    Column("sync_overhead_pct", f"{SYNC_OVERHEAD.title} %", fmt.percent),
                    Column("tflops_per_gpu", f"TFLOP/s {words.per_device()}", fmt.significant),
                    Column("mfu", "MFU", fmt.fraction),
                    *runs,
                ],
                row_class=band_class,
                csv_frame=curves.drop(columns=["band"]),
            )
        ],
    )


def latency_section(
    table: pd.DataFrame, latency: pd.DataFrame, pooled: pd.DataFrame, samples: pd.DataFrame
) -> Section:
    per_cell = table[["cell_id", "model", "variant", "world_size", "repeat"]].merge(
        latency, on="cell_id"
    )
    ms = fmt.significant
    return Section(
        "latency",
        "Step time",
        "Time per optimizer step in milliseconds; each step counts the slowest rank's time and "
        "repeated runs are pooled. Boxes span the quartiles with whiskers at 1.5 IQR; diamonds "
        "mark p95 and p99.",
        charts=charts.step_time_charts(table, samples),
        tables=[
            make_table(
                "latency-table",
                pooled,
                [
                    *cell_columns(pooled),
                    Column("steps", "Steps", fmt.integer),
                    Column("mean", "Mean", ms),
                    Column("p50", "p50", ms),
                    Column("p95", "p95", ms),
                    Column("p99", "p99", ms),
                    Column("min", "Min", ms),
                    Column("max", "Max", ms),
                    Column("cv", "CV", fmt.fraction),
                ],
                csv_note="The CSV download has one row per run.",
                csv_frame=per_cell,
            )
        ],
    )


def memory_section(by_variant: pd.DataFrame) -> Section:
    notes = []
    if (by_variant["peak_kind"] == "rss").any():
        notes.append(
            "On CPU the peak is the process's resident memory (RSS), which includes the Python "
            "runtime and libraries; activations are not measured on CPU processes."
        )
    size = fmt.human_bytes
    gpu_memory = [
        Column("gpu_memory_util_pct", f"{GPU_MEMORY_UTILISATION.title} %", fmt.significant)
    ]
    if words.on_cpu() and by_variant["gpu_memory_util_pct"].isna().all():
        gpu_memory = []  # NVML's figure: always empty on CPU processes, so not a column of "–"
    return Section(
        "memory",
        "Memory",
        "Memory of the rank with the highest peak, by part, at each configuration's smallest "
        f"count of {words.devices()}.",
        charts=charts.memory_charts(by_variant),
        tables=[
            make_table(
                "memory-table",
                by_variant,
                [
                    *cell_columns(by_variant),
                    Column("params_bytes", "Parameters", size),
                    Column("grads_bytes", "Gradients", size),
                    Column("optimizer_bytes", "Optimizer", size),
                    Column("activations_peak_bytes", "Activations", size),
                    Column("peak_bytes", "Peak", size),
                    Column("peak_kind", "Peak is", fmt.text, numeric=False),
                    *gpu_memory,
                ],
            )
        ],
        notes=notes,
    )


def utilisation_section(table: pd.DataFrame) -> Section:
    ok = table[(table["status"] == "ok") & table["tflops_per_gpu"].notna()]
    unknown = sorted({str(d) for d in ok[ok["mfu"].isna()]["device_name"].dropna()})
    notes = []
    if unknown:
        notes.append(
            "MFU needs the device's peak FLOP/s, unknown for: "
            + ", ".join(unknown)
            + f"; achieved TFLOP/s {words.per_device()} is shown instead."
        )
    return Section(
        "utilisation",
        "Compute utilisation",
        f"Model FLOPs utilisation (MFU): the model's training FLOPs per second on each "
        f"{words.device()} over the device's dense peak for the precision used. The scaling table "
        "lists both figures.",
        charts=charts.utilisation_charts(table),
        notes=notes,
    )


MAX_RANK_COLUMNS = 16
"""Up to this many ranks the per-rank table has one column per rank; past it, one row each."""


def _rank_table(pooled_ranks: pd.DataFrame, ranks: pd.DataFrame, matrix: pd.DataFrame) -> Table:
    ms = fmt.significant
    csv_note = "The CSV download has every rank of every run with its phase times."
    if pooled_ranks.empty or pooled_ranks["world_size"].max() > MAX_RANK_COLUMNS:
        return make_table(
            "rank-table",
            pooled_ranks,
            [
                *cell_columns(pooled_ranks),
                Column("rank", "Rank", fmt.integer),
                Column("step_ms_mean", "Step ms", ms),
                Column("nosync_step_ms", "No-sync step ms", ms),
                Column("sync_wait_ms", "Sync wait ms", ms),
                Column("sync_wait_pct", "Sync wait % of step", fmt.percent),
            ],
            row_class=lambda row: "straggler" if row["is_slowest"] else "",
            csv_note=csv_note,
            csv_frame=ranks,
        )
    rank_columns = [
        Column(c, c.replace("_", " "), ms) for c in matrix.columns if c.startswith("rank_")
    ]
    return make_table(
        "rank-table",
        matrix,
        [
            *cell_columns(matrix),
            Column("step_ms", "Step ms", ms),
            *rank_columns,
            Column("spread_ms", "Spread ms", ms),
            Column(
                "straggler",
                "Straggler",
                lambda v: fmt.MISSING if pd.isna(v) else f"rank {int(v)}",
                numeric=False,
            ),
        ],
        row_class=lambda row: "straggler" if not pd.isna(row["straggler"]) else "",
        caption="Mean sync wait per step, in ms, of each rank.",
        csv_note=csv_note,
        csv_frame=ranks,
    )


def sync_section(
    table: pd.DataFrame, pooled_ranks: pd.DataFrame, ranks: pd.DataFrame, rank_wait: pd.DataFrame
) -> Section:
    """``rank_wait``: each rank's mean sync wait side by side, a row per configuration."""
    return Section(
        "sync",
        "Gradient synchronisation",
        f"{SYNC_OVERHEAD.explained()} {SYNC_WAIT.explained()} The table lists every rank at "
        f"each configuration's largest count of {words.devices()}.",
        charts=charts.sync_share_charts(table) + charts.rank_wait_charts(pooled_ranks),
        tables=[_rank_table(pooled_ranks, ranks, rank_wait)] if not pooled_ranks.empty else [],
        notes=[] if not pooled_ranks.empty else [f"No cell ran on more than one {words.device()}."],
    )


def comparison_section(comparison: Comparison, threshold_pct: float, baseline: str) -> Section:
    cells = comparison.cells
    notes = [
        f"{len(frame)} cell(s) only in the {side}: " + ", ".join(charts.cell_labels(frame))
        for side, frame in (("baseline", comparison.only_old), ("new run", comparison.only_new))
        if not frame.empty
    ]
    gate = comparison.gate_line()
    if gate:
        notes.insert(0, gate)
    if cells.empty:
        return Section(
            "comparison",
            "Comparison with the baseline",
            f"No cell of {baseline} matches a cell of this run.",
            notes=notes,
        )

    def before_after(old: str, new: str) -> pd.Series:
        return cells.apply(
            lambda r: f"{fmt.significant(r[old])} → {fmt.significant(r[new])}", axis=1
        )

    def change(column: str, low: str, high: str) -> pd.Series:
        return cells.apply(
            lambda r: (
                fmt.signed_percent(r[column])
                + ("" if pd.isna(r[low]) else f" ({r[low]:+.1f}…{r[high]:+.1f})")
            ),
            axis=1,
        )

    shown = cells.assign(
        throughput=before_after("throughput_old", "throughput_new"),
        throughput_change=change(
            "throughput_change_pct", "throughput_ci_low_pct", "throughput_ci_high_pct"
        ),
        p95=before_after("p95_old_ms", "p95_new_ms"),
        p95_change=change("p95_change_pct", "p95_ci_low_pct", "p95_ci_high_pct"),
    )
    return Section(
        "comparison",
        "Comparison with the baseline",
        f"Against {baseline}: cells matched by configuration and count of {words.devices()}. A "
        "cell regresses "
        f"when throughput drops, or p95 step time rises, by more than {threshold_pct:g}% and its "
        f"interval over run-to-run noise excludes no change. {comparison.noise_line()}",
        charts=charts.comparison_charts(cells, threshold_pct),
        tables=[
            make_table(
                "comparison-table",
                shown,
                [
                    MODEL,
                    VARIANT,
                    gpus_column(),
                    Column("throughput", "Throughput before → after", fmt.text),
                    Column("throughput_change", "Change (interval)", fmt.text, numeric=False),
                    Column("p95", "p95 step ms before → after", fmt.text),
                    Column("p95_change", "Change (interval)", fmt.text, numeric=False),
                    Column("verdict", "Verdict", fmt.text, numeric=False),
                ],
                row_class=lambda row: "verdict-" + row["verdict"].replace(" ", "-"),
                csv_frame=cells,
            )
        ],
        notes=notes,
    )


def chart_sections(*sections: Optional[Section]) -> List[Section]:
    """The sections that have something to show (the comparison always does)."""
    return [s for s in sections if s is not None and (s.section_id == "comparison"
                                                      or not s.is_empty)]  # fmt: skip
