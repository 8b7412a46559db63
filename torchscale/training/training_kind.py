"""The training cell kind: one DDP training launch per model x batch size x knobs x GPU count,
one ``training`` record per cell, summarised in ``summary.csv``. Its knobs are the config's top
level (no section of its own)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Type

from torchscale.config.settings import BenchmarkConfig, CellSettings
from torchscale.hardware.device_noun import CUDA, count_text
from torchscale.kinds.kind_registry import TRAINING_KIND
from torchscale.models.registry import describe as describe_model
from torchscale.plan.kind_base import KindBase
from torchscale.plan.planned_cell import Cell, KindSettings
from torchscale.plan.training_cells import (
    cell_id,
    count_training,
    training_settings,
    training_swept,
)
from torchscale.results.layout import SUMMARY
from torchscale.results.schema import CellStatus, ResultBase, TrainingResult

if TYPE_CHECKING:
    from pandas import DataFrame

    from torchscale.report.elements import Card, Section
    from torchscale.report.reported_kinds import RanIterations


def _settings(cell: Cell) -> CellSettings:
    assert isinstance(cell.settings, CellSettings), cell.kind
    return cell.settings


def gpus_text(gpus: int, nnodes: int) -> str:
    """``4``, or ``4 (2x2)`` for 4 ranks on 2 nodes."""
    nnodes = int(nnodes) if nnodes == nnodes else 1  # NaN in an empty table column
    return str(gpus) if nnodes <= 1 else f"{gpus} ({nnodes}x{int(gpus) // nnodes})"


class TrainingKind(KindBase):
    """The core kind: its pieces are the stages' own (see the module's docstring), so it
    overrides nearly every default of ``KindBase``."""

    name = TRAINING_KIND
    settings_model = CellSettings
    worker_module = "torchscale.worker"
    record_models: Tuple[Type[ResultBase], ...] = (TrainingResult,)
    selections: Tuple[str, ...] = ("all", "training", "memory")
    profiled = True
    joins_warm_groups = True

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        if config.models:
            return None
        return "models, and the config lists none: add models: [...] or use --benchmark comm"

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        return count_training(config, benchmark, gpus_per_node)

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        yield from training_settings(config, benchmark, gpus_per_node)

    def cell_id(self, settings: KindSettings) -> str:
        assert isinstance(settings, CellSettings)
        return cell_id(settings)

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        return training_swept(config, benchmark)

    @staticmethod
    def _fields(cell: Cell) -> Dict[str, Any]:
        s = _settings(cell)
        return {
            "model": s.model,
            "batch_size": s.batch_size,
            "grad_accum_steps": s.grad_accum_steps,
            "global_batch_size": s.gpus * s.batch_size * s.grad_accum_steps,
            "precision": s.precision,
        }

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        hosts = sorted({r["host"] for r in result.get("per_rank", [])})
        fields = {**identity, **self._fields(cell), **result, "status": "ok", "hosts": hosts}
        return [TrainingResult(**fields)]

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        entry = describe_model(_settings(cell).model)  # a built-in model's unit is known
        known: Dict[str, Any] = {"unit": entry.unit} if entry else {}
        return [
            TrainingResult(**identity, **self._fields(cell), **known, status=status, error=error)
        ]

    def describe(self, cell: Cell, device_kind: str = CUDA) -> str:
        s = _settings(cell)
        nodes = f" x {s.nnodes} nodes" if s.nnodes > 1 else ""
        ranks = count_text(s.gpus, device_kind)
        return f"{s.model} on {ranks}{nodes} (batch {s.batch_size}, {s.precision})"

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        s = _settings(cell)
        settings = s.model_dump()
        values = []
        for knob in knobs:
            node: Any = settings
            for part in knob.split("."):
                node = node[part]
            values.append(str(node))
        return [s.model, str(s.batch_size), gpus_text(s.gpus, s.nnodes), s.precision, *values]

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        # each training record prints its own lines (cli.benchmark_view); strategies compared here
        from torchscale.training.strategy_section import strategy_lines

        return strategy_lines(records)

    def summary_tables(self, records: List[ResultBase]) -> Dict[str, DataFrame]:
        """``summary.csv``, written even before any training record exists."""
        from torchscale.analysis.training_tables import training_table

        return {SUMMARY: training_table(records).drop(columns=["config_key"])}

    def analyze_traces(self, profile_dir: Path, target: str) -> Dict[str, object]:
        from torchscale.training.cell_traces import analyze_traces

        return analyze_traces(profile_dir, target)

    # The report: its training sections, cards and document entries are the report's own
    # (every report has them, from the training records); what the cells ran is the kind's.

    def report_sections(self, records: List[ResultBase]) -> List[Optional[Section]]:
        from torchscale.training.strategy_section import strategy_section

        return [strategy_section(records)]

    def report_cards(self, records: List[ResultBase]) -> List[Card]:
        return []

    def document_results(self, records: List[ResultBase]) -> Dict[str, object]:
        return {}

    def document_iterations(self, records: List[ResultBase]) -> Optional[RanIterations]:
        """The warm-up and measured steps of the measured training records (a script cell's
        too: it writes training records)."""
        from torchscale.report.reported_kinds import RanIterations

        ran = [r for r in records if isinstance(r, TrainingResult) and r.status == "ok"]
        if not ran:
            return None
        return RanIterations.of((r.warmup_steps for r in ran), (r.measure_steps for r in ran))


KIND = TrainingKind()
