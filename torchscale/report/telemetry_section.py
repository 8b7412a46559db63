"""The report's "Telemetry" section: per-GPU clocks, power, temperature and throttling over the
measured window (NVML), or on CPU each rank's CPU time and run-queue wait."""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from torchscale.measures.figures import GPU_MEMORY_UTILISATION
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.charts import chart_id
from torchscale.report.elements import Chart, Column, Section, Series, Table, make_table
from torchscale.report.sections import VARIANT

MAX_TIMELINES = 8
"""Timeline charts shown (the cells with the most GPUs first); every sample is in the CSV."""


def _mhz(value: Optional[float]) -> str:
    return fmt.MISSING if value is None or pd.isna(value) else f"{float(value):,.0f}"


def _gpu_rows(table: pd.DataFrame) -> pd.DataFrame:
    clocks = table.apply(
        lambda r: (
            f"{_mhz(r['sm_clock_mhz_mean'])} (min {_mhz(r['sm_clock_mhz_min'])}, "
            f"limit {_mhz(r['sm_clock_mhz_limit'])})"
        ),
        axis=1,
    )
    power = table.apply(lambda r: f"{_mhz(r['power_w_mean'])} / {_mhz(r['power_limit_w'])}", axis=1)
    return table.assign(clocks=clocks, power=power)


def _timeline_charts(timeline: pd.DataFrame) -> List[Chart]:
    charts = []
    many = timeline["experiment"].nunique() > 1
    cells = (
        timeline.groupby("cell_id", sort=False)["world_size"].first().sort_values(ascending=False)
    )
    for cell_id in list(cells.index)[:MAX_TIMELINES]:
        rows = timeline[timeline["cell_id"] == cell_id]
        series = [
            Series(gpu, group["t_s"].tolist(), group["sm_clock_mhz"].tolist())
            for gpu, group in rows.groupby("gpu", sort=True)
        ]
        model, world = rows["model"].iloc[0], int(rows["world_size"].iloc[0])
        charts.append(
            Chart(
                chart_id("gpu-timeline", cell_id),
                f"SM clock over the measured window — {model}, {world} GPUs ({cell_id})"
                + (f" ({rows['experiment'].iloc[0]})" if many else ""),
                "seconds into the window",
                "SM clock (MHz)",
                series,
                rows[
                    [
                        "gpu",
                        "t_s",
                        "util_pct",
                        "sm_clock_mhz",
                        "power_w",
                        "temperature_c",
                        "reasons",
                    ]
                ],
                y_from_zero=False,
            )
        )
    return charts


def _gpu_table(table: pd.DataFrame) -> Table:
    shown = _gpu_rows(table)
    return make_table(
        "gpu-telemetry-table",
        shown,
        [
            Column("model", "Model", fmt.text, numeric=False),
            VARIANT,
            Column("world_size", "GPUs", fmt.integer),
            Column("rank", "Rank", fmt.integer),
            Column("gpu", "GPU", fmt.text, numeric=False),
            Column("util_pct_mean", "Util %", fmt.significant),
            Column("memory_util_pct", f"{GPU_MEMORY_UTILISATION.title} %", fmt.significant),
            Column("clocks", "SM clock MHz", fmt.text),
            Column("mem_clock_mhz_mean", "Mem clock MHz", _mhz),
            Column("power", "Power W / limit", fmt.text),
            Column("temperature_c_max", "Temp max °C", fmt.significant),
            Column("throttle", "Clocks-event reasons (share of window)", fmt.text, numeric=False),
            Column("pcie", "PCIe", fmt.text, numeric=False),
        ],
        row_class=lambda row: "status-failed" if row["throttle"] != "none" else "",
        csv_frame=table,
    )


def _cpu_table(table: pd.DataFrame) -> Table:
    return make_table(
        "cpu-telemetry-table",
        table,
        [
            Column("model", "Model", fmt.text, numeric=False),
            VARIANT,
            Column("world_size", words.count_header(), fmt.integer),
            Column("rank", "Rank", fmt.integer),
            Column("host", "Host", fmt.text, numeric=False),
            Column("cpu_share", "CPU time / window", fmt.fraction),
            Column("cpu_wait_share", "Waiting for a CPU", fmt.fraction),
            Column("other_processes_cores", "Other processes, cores", fmt.significant),
            Column("nosync_step_ms", "Compute-only step ms", fmt.significant),
            Column("sync_wait_ms", "Sync wait ms", fmt.significant),
        ],
        csv_frame=table,
    )


def telemetry_section(
    gpus: pd.DataFrame, cpus: pd.DataFrame, timeline: pd.DataFrame
) -> Optional[Section]:
    """``gpus``, ``cpus``: a row per rank with its configuration (``variant``); ``timeline``: the
    GPUs' samples over the window."""
    if gpus.empty and cpus.empty:
        return None
    tables, charts, notes = [], [], []
    if not gpus.empty:
        tables.append(_gpu_table(gpus))
        charts = _timeline_charts(timeline)
    if not cpus.empty:
        tables.append(_cpu_table(cpus))
        notes.append(
            "CPU ranks: the training thread's CPU time and the time it was runnable but waiting "
            "for a CPU (Linux schedstat) over the measured window. A rank that waits for a CPU "
            "shares its cores with other processes: it was preempted, the host oversubscribed."
        )
    intro = (
        "What each GPU did during the measured window, sampled from NVML every 100 ms: "
        "utilisation, SM and memory clocks, power against its limit, temperature, and the "
        "clocks-event (throttle) reasons with the share of samples that reported them."
        if not gpus.empty
        else "What each rank's CPU process did during the measured window."
    )
    return Section(
        "telemetry",
        "Telemetry",
        intro,
        charts=charts,
        tables=tables,
        notes=notes,
    )
