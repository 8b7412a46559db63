"""What ``torchscale benchmark`` shows on stderr: progress, per-cell lines, plan, results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from torchscale.cli.console import err_console, say
from torchscale.kinds.kind_registry import get_kind
from torchscale.kinds.training_kind import gpus_text
from torchscale.plan.matrix import Plan
from torchscale.plan.planned_cell import Cell
from torchscale.results.figures import GLOSSARY_DOC, SCALING_EFFICIENCY, STEP_TIME, SYNC_OVERHEAD
from torchscale.results.layout import MANIFEST, RESULTS, SUMMARY
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.results.table_scalars import as_float, as_int

if TYPE_CHECKING:
    from pandas import DataFrame


def _fmt(value: object, spec: str = ",.1f", suffix: str = "") -> str:
    """A table cell or a record's figure: ``-`` when missing or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{as_float(value):{spec}}{suffix}"


def describe_cell(cell: Cell) -> str:
    return get_kind(cell.kind).describe(cell)


class ConsoleEvents:
    """Rich progress over the matrix plus the seed's per-cell lines."""

    def __init__(self) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("cells"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        )
        self.task: Any = None
        self.current = ""

    def __enter__(self) -> ConsoleEvents:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def cell_started(self, cell: Cell, position: int, total: int) -> None:
        if self.task is None:
            self.task = self.progress.add_task("", total=total)
        self.current = describe_cell(cell)
        self.progress.update(self.task, description=self.current)
        err_console.print(f"> Running {self.current}...")

    def cell_polled(self, elapsed_s: float) -> None:
        self.progress.update(self.task, description=f"{self.current} [{elapsed_s:.0f}s]")

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None:
        self.progress.advance(self.task)
        for record in records:
            if isinstance(record, TrainingResult):
                self._training_lines(record, table)
        for line in get_kind(cell.kind).console_lines(records):
            say(line)

    def _training_lines(self, record: TrainingResult, table: Optional[DataFrame]) -> None:
        if record.status != "ok":
            label = "SKIP" if record.status == "skipped" else "FAIL"
            # Errors quote tracebacks and paths: brackets in them are text, not Rich markup.
            say(f"> [{label}] {record.status}: {record.error}")
            return
        row = table.loc[table["cell_id"] == record.cell_id] if table is not None else None
        found = row is not None and len(row) > 0
        eff = float(row["scaling_efficiency"].iloc[-1]) if row is not None and found else math.nan
        base = float(row["baseline_world_size"].iloc[-1]) if row is not None and found else math.nan
        # Only a cell measured against a smaller GPU count has a scaling figure.
        compared = not math.isnan(eff) and base < record.world_size
        versus = f"{base:.0f} GPU" + ("s" if base > 1 else "")
        eff_text = f" ({SCALING_EFFICIENCY.name} {eff:.0%} vs {versus})" if compared else ""
        steps = record.step_time_ms
        err_console.print(
            f"> [INFO] Average Throughput: {_fmt(record.throughput, ',.0f')} "
            f"{record.unit}/sec{eff_text}"
        )
        if steps:
            err_console.print(
                f"> [INFO] Iteration Latency: {steps.mean:,.1f}ms "
                f"(p50 {steps.p50:,.1f}, p95 {steps.p95:,.1f}, p99 {steps.p99:,.1f})"
            )
        if record.sync and record.sync.warning:
            say(f"> [WARN] {record.sync.warning}.")
        from torchscale.analysis.iteration_breakdown import comm_compute_line
        from torchscale.analysis.telemetry import console_lines

        ratio = comm_compute_line(record) if record.world_size > 1 else None
        for line in [*([ratio] if ratio else []), *console_lines(record)]:
            say(line)


def plan_table(plan: Plan) -> Table:
    """One row per cell: its id, the matrix axes and every knob that varies (fits 80 columns:
    see ``cli/console_tables.py``)."""
    from torchscale.cli.console_tables import Col, fitted_table

    knobs = [k for k in plan.swept if k not in ("models", "batch_sizes", "gpu_counts", "nodes")]
    rows: List[List[str]] = []
    for cell in plan.cells:
        row = get_kind(cell.kind).plan_row(cell, knobs)
        rows.append([str(cell.index + 1), cell.cell_id, *row])
    headers = ["#", "cell", "model", "batch", "GPUs", "precision", *knobs]
    columns = list(zip(*rows)) if rows else [()] * len(headers)
    cols = [
        Col(
            header,
            list(values),
            numeric=False,
            wrap=header in ("cell", "model"),
            same=None if header in ("#", "cell") else f"{header} {{}}",
        )
        for header, values in zip(headers, columns)
    ]
    title = f"{plan.config.experiment_name}: {len(plan)} cells"
    return fitted_table(err_console, title, cols)


def _knobs(rows: List[Any]) -> List[List[str]]:
    """The ``knobs`` column of the training table (``analysis.scaling.label_variants``), when a
    sweep set any."""
    knobs = [str(getattr(r, "knobs", "") or "") for r in rows]
    return [knobs] if any(knobs) else []


UNIT_SHORT = {"images": "img", "sequences": "seq", "tokens": "tok", "samples": "smp"}


def results_table(table: DataFrame, title: str) -> Table:
    """The final table: every figure in full at any console width (``cli/console_tables.py``)."""
    from torchscale.cli.console_tables import Col, fitted_table

    rows = list(table.itertuples())
    units = [row.unit if isinstance(row.unit, str) else "" for row in rows]
    numbers = [_fmt(r.throughput, ",.1f") for r in rows]
    short = [UNIT_SHORT.get(u, u) for u in units]
    one_unit = len(set(units)) == 1 and units[0]
    cols = [
        Col("model", [str(r.model) for r in rows], numeric=False, wrap=True),
        Col("batch", [str(r.batch_size) for r in rows], same="batch {}"),
        Col(
            "GPUs",
            [gpus_text(as_int(r.world_size), as_int(r.nnodes)) for r in rows],
            same="{} GPUs",
        ),
        Col("prec", [str(r.precision) for r in rows], numeric=False, same="{}", drop=1),
        # The other swept settings (ddp.bucket_cap_mb=25...): a sweep's rows are never alike.
        *[Col("settings", knobs, numeric=False, wrap=True, same="{}") for knobs in _knobs(rows)],
        Col("status", [str(r.status) for r in rows], numeric=False, same="all {}"),
        Col(
            "throughput",
            [n + (f" {u}/s" if u and n != "-" else "") for n, u in zip(numbers, units)],
            compact=f"{short[0]}/s" if one_unit else "throughput",
            compact_values=numbers
            if one_unit
            else [n + (f" {u}/s" if u and n != "-" else "") for n, u in zip(numbers, short)],
        ),
        Col(
            f"{STEP_TIME.name} p50/p95 ms",
            [f"{_fmt(r.step_ms_p50)}/{_fmt(r.step_ms_p95)}" for r in rows],
            compact=f"{STEP_TIME.name}\np50/p95 ms",
            drop=3,
        ),
        # One rank has no sync overhead, a lone GPU count no scaling efficiency: "-" (glossary).
        Col(
            f"{SYNC_OVERHEAD.name} %",
            [_fmt(r.sync_overhead_pct, ".1f") for r in rows],
            compact=SYNC_OVERHEAD.name.replace(" ", "\n") + " %",
            drop=2,
        ),
        Col(
            SCALING_EFFICIENCY.name,
            [_fmt(r.scaling_efficiency, ".0%") for r in rows],
            compact=SCALING_EFFICIENCY.name.replace(" ", "\n"),
        ),
        Col(
            "MFU",
            [_fmt(r.mfu, ".1%") for r in rows],
            same=lambda v: "MFU n/a (device peak unknown)" if v == "-" else f"MFU {v}",
            drop=4,
        ),
    ]
    left_out = f"see {SUMMARY} or --json; figures: {GLOSSARY_DOC}"
    return fitted_table(err_console, title, cols, left_out=left_out)


def models_table(entries: List[Any]) -> Table:
    table = Table(title="Built-in models", title_justify="left")
    for column in ("name", "family", "unit", "parameters", "description"):
        table.add_column(column, justify="right" if column == "parameters" else "left")
    for entry in entries:
        params = f"{entry.params / 1e6:,.1f}M" if entry.params else "-"
        table.add_row(entry.name, entry.family, entry.unit, params, entry.description)
    table.caption = "Your own model: models: ['package.module:function'] returning a ModelSpec."
    return table


def experiment_path_hint(path: Path) -> str:
    return f"results in {path} ({RESULTS}, {SUMMARY}, {MANIFEST})"
