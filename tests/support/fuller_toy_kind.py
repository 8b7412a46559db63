"""The toy kind (``toy_kind.py``) with the optional pieces a real kind overrides: readable cell
ids, its own plan rows, console lines and table at the end, a summary CSV of its choosing, and
the report pieces (``report.reported_kinds.ReportedKind``). Registered in place of the toy (the
same name) by ``tests/test_kind_plugins.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

import pandas as pd

from tests.support.toy_kind import ToyCellSettings, ToyKind, ToyResult
from torchscale.plan.planned_cell import Cell, KindSettings, settings_digest
from torchscale.results.schema import ResultBase

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from torchscale.report.elements import Card, Section
    from torchscale.report.reported_kinds import RanIterations

SUMMARY_TOY = "toy_echoes.csv"


def _word(cell: Cell) -> str:
    assert isinstance(cell.settings, ToyCellSettings)
    return cell.settings.word


class FullerToyKind(ToyKind):
    def cell_id(self, settings: KindSettings) -> str:
        assert isinstance(settings, ToyCellSettings)
        return f"toy-{settings.word}-g{settings.gpus}-{settings_digest(settings)}"

    def describe(self, cell: Cell, device_kind: str = "cuda") -> str:
        return f"toy echo of {_word(cell)!r} on {cell.settings.gpus} ranks"

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        return [f"toy:{_word(cell)}", "-", str(cell.settings.gpus), "-", *["-"] * len(knobs)]

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        return [f"> [TOY] {r.word}: {r.status}" for r in records if isinstance(r, ToyResult)]

    def console_tables(
        self, records: List[ResultBase], title: str, console: Console
    ) -> List[RenderableType]:
        from rich.table import Table

        table = Table(title=f"{title}: toy echoes")
        table.add_column("word")
        table.add_column("status")
        for row in _table(records).itertuples():
            table.add_row(str(row.word), str(row.status))
        return [table] if table.row_count else []

    def summary_tables(self, records: List[ResultBase]) -> Dict[str, pd.DataFrame]:
        table = _table(records)
        return {SUMMARY_TOY: table} if not table.empty else {}

    def report_sections(self, records: List[ResultBase]) -> List[Optional[Section]]:
        from torchscale.report import formatting as fmt
        from torchscale.report.elements import Column, Section, make_table

        table = _table(records)
        if table.empty:
            return [None]
        columns = [
            Column("word", "Word", fmt.text, numeric=False),
            Column("status", "Status", fmt.text, numeric=False),
        ]
        return [Section("toy", "Toy echoes", "Every word the toy kind echoed.",
                        tables=[make_table("toy-table", table, columns)])]  # fmt: skip

    def document_results(self, records: List[ResultBase]) -> Dict[str, object]:
        return {}  # the JSON document (distributed_benchmarks' format) has no place for toy echoes

    def report_cards(self, records: List[ResultBase]) -> List[Card]:
        from torchscale.report.elements import Card

        echoed = len(_table(records))
        return [Card("Words echoed", str(echoed), "by the toy kind")] if echoed else []

    def document_iterations(self, records: List[ResultBase]) -> Optional[RanIterations]:
        """No warm-up; each echo "measures" its word's letters."""
        from torchscale.report.reported_kinds import RanIterations

        ok = [r for r in records if isinstance(r, ToyResult) and r.status == "ok"]
        return RanIterations.of([0] * len(ok), [len(r.word) for r in ok]) if ok else None


def _table(records: List[ResultBase]) -> pd.DataFrame:
    rows = [r.model_dump(include={"cell_id", "word", "status", "error", "echo_ms"})
            for r in records if isinstance(r, ToyResult)]  # fmt: skip
    return pd.DataFrame(rows, columns=["cell_id", "word", "status", "error", "echo_ms"])


KIND = FullerToyKind()
