"""``benchmark --dry-run`` on the console: the plan's tables and each cell's command (stderr), or
one JSON array (stdout), printed as the cells are expanded."""

from __future__ import annotations

import itertools
import textwrap
from typing import TYPE_CHECKING, Iterator, List

from torchscale.cli.console import result_console, write_stdout

if TYPE_CHECKING:
    from torchscale.app.preview import PlannedCell, PlanPreview
    from torchscale.config.settings import BenchmarkConfig


def _note(line: str) -> None:
    result_console.print(line, soft_wrap=True, markup=False)


DRY_RUN_CHUNK = 500
"""Cells per table when a dry run prints a large plan (a plan up to this size is one table)."""


def _chunks(cells: Iterator[PlannedCell], size: int) -> Iterator[List[PlannedCell]]:
    while True:
        chunk = list(itertools.islice(cells, size))
        if not chunk:
            return
        yield chunk


def print_plan(preview: PlanPreview, config: BenchmarkConfig, json_output: bool) -> None:
    """Print the plan as it is expanded, so a matrix of any size (up to --max-cells) prints in
    bounded memory: tables of ``DRY_RUN_CHUNK`` cells, each followed by its commands; with
    ``--json``, one array written element by element."""
    from torchscale.cli.benchmark_view import plan_table
    from torchscale.plan.matrix import Plan
    from torchscale.results.files import dumps

    stream = preview.cells()
    # Bad input (a matrix over --max-cells, ...) raises at the first cell: before any output.
    stream = itertools.chain(list(itertools.islice(stream, 1)), stream)
    for warning in preview.warnings:
        _note(f"> [WARN] {warning}")
    if json_output:
        separator = "\n"
        write_stdout("[")
        for planned in stream:
            if planned.visited:
                document = {
                    "cell_id": planned.cell.cell_id,
                    "settings": planned.cell.settings.model_dump(mode="json"),
                    "command": planned.command,
                    "skip_reason": planned.skip_reason,
                }
                write_stdout(separator + textwrap.indent(dumps(document, indent=2), "  "))
                separator = ",\n"
        write_stdout("]\n" if separator == "\n" else "\n]\n")
        return
    swept = preview.swept
    kind = preview.devices.kind
    chunks = _chunks(stream, DRY_RUN_CHUNK)
    chunk = next(chunks, [])
    done = 0
    while chunk:
        following = next(chunks, [])
        table = plan_table(Plan(config, [p.cell for p in chunk], swept), kind, done + 1)
        if done or following:  # one of several tables: say which cells it holds
            table.title = f"{config.experiment_name}: cells {done + 1}-{done + len(chunk)}"
        result_console.print(table)
        for position, planned in enumerate(chunk, done + 1):
            if planned.visited:
                _note(f"[{position}] {planned.command}")
        done += len(chunk)
        chunk = following
    skipped = preview.skipped
    note = f"; {len(skipped)} of {done} cells would be skipped on this node" if skipped else ""
    if preview.done:
        note += (
            f"; {len(preview.done)} cell(s) already have results in {preview.store_root} and "
            "are not listed (--resume runs only the cells above)"
        )
    _note(f"dry run: nothing was run or written (results would go to {preview.store_root}){note}")
