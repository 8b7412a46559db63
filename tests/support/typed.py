"""Typed views of what a test knows and the types leave open: a plan's cells and a store's
records are typed for any kind, and a test of the training kind reads them as training's."""

from __future__ import annotations

from typing import Iterable, List

from torchscale.config.settings import CellSettings
from torchscale.plan.planned_cell import Cell
from torchscale.results.schema import ResultBase, TrainingResult


def training_settings(cell: Cell) -> CellSettings:
    """A training cell's settings (asserted: a cell of another kind fails the test)."""
    assert isinstance(cell.settings, CellSettings), cell.settings
    return cell.settings


def training_records(records: Iterable[ResultBase]) -> List[TrainingResult]:
    """Records that are all training records (asserted, never filtered)."""
    records = list(records)
    assert all(isinstance(r, TrainingResult) for r in records), records
    return [r for r in records if isinstance(r, TrainingResult)]
