"""What ``torchscale benchmark`` shows on stderr: progress, per-cell lines, plan, results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any, List, Optional

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

from torchscale.cli.console import err_console, markup_text, say
from torchscale.cli.running_cell import RunningCell, say_progress
from torchscale.hardware.device_noun import CUDA, count_header, count_text, record_device_kind
from torchscale.measures.figures import GLOSSARY_DOC, SCALING_EFFICIENCY, STEP_TIME, SYNC_OVERHEAD
from torchscale.measures.straggler import record_straggler
from torchscale.measures.table_scalars import as_float, as_int
from torchscale.plan.kind_protocol import get_kind
from torchscale.plan.matrix import Plan
from torchscale.plan.planned_cell import Cell
from torchscale.results.layout import MANIFEST, RESULTS, SUMMARY, cell_output_dir
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.training.training_kind import gpus_text

if TYPE_CHECKING:
    from pandas import DataFrame


def _fmt(value: object, spec: str = ",.1f", suffix: str = "") -> str:
    """A table cell or a record's figure: ``-`` when missing or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{as_float(value):{spec}}{suffix}"


class ConsoleEvents:
    """Rich progress over the matrix plus the seed's per-cell lines. In a terminal the progress
    bar says where the running cell is; in a log (CI, a file) a line every 10 s does. A cell the
    profiler traced ends with a line naming why, where and what it found
    (``cli/running_cell.py``)."""

    def __init__(self, profile_lines: bool = True) -> None:
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
        self.running = RunningCell()
        self.profile_lines = profile_lines

    def __enter__(self) -> ConsoleEvents:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
        if self.task is None:
            self.task = self.progress.add_task("", total=total)
        described = self.running.start(cell, cell_dir)
        self.progress.update(self.task, description=markup_text(described))
        say(f"> Running {described}...")

    def cell_polled(self, elapsed_s: float) -> None:
        if err_console.is_terminal:
            where = f"{self.running.described} [{self.running.where(elapsed_s)}]"
            self.progress.update(self.task, description=markup_text(where))
        else:
            say_progress(self.running, elapsed_s)

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[DataFrame]
    ) -> None:
        self.progress.advance(self.task)
        for record in records:
            if isinstance(record, TrainingResult):
                self._training_lines(record, table)
        for line in get_kind(cell.kind).console_lines(records):
            say(line)
        for record in records if self.profile_lines else []:
            traced = self.running.profile_line(record)
            if traced:
                say(traced)

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
        versus = count_text(int(base), record_device_kind(record)) if compared else ""
        eff_text = f" ({SCALING_EFFICIENCY.name} {eff:.0%} vs {versus})" if compared else ""
        steps = record.step_time_ms
        say(
            f"> [INFO] Average Throughput: {_fmt(record.throughput, ',.0f')} "
            f"{record.unit}/sec{eff_text}"
        )
        if steps:
            say(
                f"> [INFO] Iteration Latency: {steps.mean:,.1f}ms "
                f"(p50 {steps.p50:,.1f}, p95 {steps.p95:,.1f}, p99 {steps.p99:,.1f})"
            )
        if record.sync and record.sync.warning:
            say(sync_warning_line(record, self.running.cell_dir))
        from torchscale.analysis.iteration_breakdown import comm_compute_line
        from torchscale.analysis.telemetry import console_lines

        ratio = comm_compute_line(record) if record.world_size > 1 else None
        for line in [*([ratio] if ratio else []), *console_lines(record)]:
            say(line)


def sync_warning_line(record: TrainingResult, cell_dir: Optional[Path]) -> str:
    """The worker's sync warning; where it names a straggler and the output folder holds a
    validate record of its host, with the figure that explains it, as the report and profile
    quote it."""
    from torchscale.analysis.host_attribution import straggler_quote
    from torchscale.results.host_records import load_host_records

    line = f"> [WARN] {record.sync.warning if record.sync else ''}."
    if cell_dir is None or record_straggler(record) is None:
        return line
    quote = straggler_quote(record, load_host_records(cell_output_dir(cell_dir)))
    return f"{line} {quote}" if quote else line


def plan_table(plan: Plan, device_kind: str = CUDA, first: int = 1) -> Table:
    """One row per cell: its id, the matrix axes and every knob that varies (fits 80 columns:
    see ``console_tables.py``). A knob the matrix sweeps is a column of its own; the
    axes' own settings (``precision`` among them) are never listed twice. Rows are numbered
    from ``first`` in the order given (the run's order)."""
    from torchscale.console_tables import Col, fitted_table

    axes = ("models", "batch_sizes", "gpu_counts", "nodes", "precision")
    knobs = [k for k in plan.swept if k not in axes]
    rows: List[List[str]] = []
    for position, cell in enumerate(plan.cells, first):
        row = get_kind(cell.kind).plan_row(cell, knobs)
        rows.append([str(position), cell.cell_id, *row])
    ranks = count_header(device_kind)
    headers = ["#", "cell", "model", "batch", ranks, "precision", *knobs]
    columns = list(zip(*rows)) if rows else [()] * len(headers)

    def same(header: str) -> Optional[str]:
        if header in ("#", "cell"):
            return None
        return f"{{}} {ranks}" if header == ranks else f"{header} {{}}"

    cols = [
        Col(
            header,
            list(values),
            numeric=False,
            wrap=header in ("cell", "model"),
            same=same(header),
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


def results_table(
    table: DataFrame, title: str, device_kind: str = CUDA, busy: AbstractSet[str] = frozenset()
) -> Table:
    """The final table: every figure in full at any console width (``console_tables.py``);
    on CPU processes the rank column is ``ranks`` and the note says they are not GPUs. A cell
    in ``busy`` (measured while other processes held the cores, ``analysis.busy_host``) has the
    status ``busy host``: the footer never calls such a table "all ok"."""
    from torchscale.console_tables import Col, fitted_table
    from torchscale.measures.figures import BUSY_HOST

    rows = list(table.itertuples())
    statuses = [
        BUSY_HOST if r.status == "ok" and str(getattr(r, "cell_id", "")) in busy else str(r.status)
        for r in rows
    ]
    units = [row.unit if isinstance(row.unit, str) else "" for row in rows]
    numbers = [_fmt(r.throughput, ",.1f") for r in rows]
    short = [UNIT_SHORT.get(u, u) for u in units]
    one_unit = len(set(units)) == 1 and units[0]
    ranks = count_header(device_kind)
    cols = [
        Col("model", [str(r.model) for r in rows], numeric=False, wrap=True),
        Col("batch", [str(r.batch_size) for r in rows], same="batch {}"),
        Col(
            ranks,
            [gpus_text(as_int(r.world_size), as_int(r.nnodes)) for r in rows],
            same=lambda v: count_text(int(v), device_kind) if v.isdigit() else f"{v} {ranks}",
        ),
        Col("prec", [str(r.precision) for r in rows], numeric=False, same="{}", drop=1),
        # The other swept settings (ddp.bucket_cap_mb=25...): a sweep's rows are never alike.
        *[Col("settings", knobs, numeric=False, wrap=True, same="{}") for knobs in _knobs(rows)],
        Col("status", statuses, numeric=False, same="all {}"),
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
    """``--list-models``, fitted to the console like every table."""
    from torchscale.console_tables import Col, fitted_table

    def text(values: List[str], header: str, **options: Any) -> Col:
        return Col(header, values, numeric=False, **options)

    cols = [
        text([e.name for e in entries], "name"),
        text([e.family for e in entries], "family"),
        text([e.unit for e in entries], "unit"),
        Col("parameters", [f"{e.params / 1e6:,.1f}M" if e.params else "-" for e in entries]),
        text([e.description for e in entries], "description", fill=True),
    ]
    table = fitted_table(err_console, "Built-in models", cols)
    table.caption = "Your own model: models: ['package.module:function'] returning a ModelSpec."
    return table


def experiment_path_hint(path: Path) -> str:
    return f"results in {path} ({RESULTS}, {SUMMARY}, {MANIFEST})"
