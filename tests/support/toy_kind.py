"""A cell kind defined in this one module and nowhere else: what a new kind has to provide.

``tests/test_kind_plugins.py`` registers it at test time (``kind_registry.added_kind``), exactly as
a line in ``KIND_MODULES`` would, and runs it through config, plan, dry run, sweep, summary CSV,
console and report. Its cells ask for the ``mpi`` backend under torchrun, which the sweep skips
before any launch on every machine, so the sweep records them without a process.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Literal, Optional, Tuple, Type

import pandas as pd
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from torchscale.config.base import StrictModel
from torchscale.config.kind_sections import ConfigSection
from torchscale.config.settings import BenchmarkConfig
from torchscale.plan.planned_cell import Cell, KindSettings, node_counts, settings_digest
from torchscale.results.schema import CellStatus, ResultBase

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from torchscale.report.elements import Card, Section
    from torchscale.report.reported_kinds import RanIterations

SUMMARY_TOY = "summary_toy.csv"


class ToySection(StrictModel):
    """``toy:`` in the benchmark YAML."""

    words: List[str] = Field(min_length=1, description="One cell per word and GPU count.")
    backend: Literal["auto", "gloo", "mpi"] = Field("mpi", description="Process-group backend.")


class ToyCellSettings(StrictModel):
    word: str
    gpus: PositiveInt
    nnodes: PositiveInt = 1
    repeat: NonNegativeInt = 0
    cell_timeout_s: PositiveFloat = 60.0
    backend: str = "mpi"

    @property
    def nproc_per_node(self) -> int:
        return self.gpus // self.nnodes


class ToyResult(ResultBase):
    kind: Literal["toy_echo"] = "toy_echo"
    word: str
    echo_ms: Optional[float] = None


SECTION = ConfigSection("toy", ToySection, "Words to echo (a test's own kind).")


def _section(config: BenchmarkConfig) -> Optional[ToySection]:
    section = config.kind_section(SECTION.key)
    assert section is None or isinstance(section, ToySection)
    return section


def _settings(cell: Cell) -> ToyCellSettings:
    assert isinstance(cell.settings, ToyCellSettings)
    return cell.settings


class ToyKind:
    name = "toy"
    config_section = SECTION
    settings_model = ToyCellSettings
    worker_module = "tests.support.toy_kind"
    record_models: Tuple[Type[ResultBase], ...] = (ToyResult,)
    selections: Tuple[str, ...] = ("all", "toy")
    profiled = False
    joins_warm_groups = False
    own_threads = False

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        return None if _section(config) else "a toy: section"

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        section = _section(config)
        total = len(section.words) * len(config.gpu_counts) if section else 0
        return total, [f"toy {total}"]

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        section = _section(config)
        assert section is not None
        for word, gpus in itertools.product(section.words, config.gpu_counts):
            for nnodes in node_counts(gpus, config, gpus_per_node):
                yield ToyCellSettings(word=word, gpus=gpus, nnodes=nnodes, backend=section.backend)

    def cell_id(self, settings: KindSettings) -> str:
        assert isinstance(settings, ToyCellSettings)
        return f"toy-{settings.word}-g{settings.gpus}-{settings_digest(settings)}"

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        section = _section(config)
        return ["toy.words"] if section and len(section.words) > 1 else []

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        word = _settings(cell).word
        return [ToyResult(**identity, word=word, echo_ms=result["echo_ms"], status="ok")]

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        return [ToyResult(**identity, word=_settings(cell).word, status=status, error=error)]

    def analyze_traces(self, profile_dir: Path, target: str) -> Dict[str, object]:
        return {"reason": "toy cells are not profiled"}

    def describe(self, cell: Cell, device_kind: str = "cuda") -> str:
        return f"toy echo of {_settings(cell).word!r} on {cell.settings.gpus} ranks"

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        return [
            f"toy:{_settings(cell).word}",
            "-",
            str(cell.settings.gpus),
            "-",
            *["-"] * len(knobs),
        ]

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


KIND = ToyKind()
