"""What one kind of cell provides: how it is planned, what it launches, which records it
writes, and how a finished cell shows on the console.

The registry (``torchscale.kinds.kind_registry``) lists the kinds; nothing outside it compares a
kind name with a literal.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Protocol, Tuple, Type

from torchscale.config.settings import BenchmarkConfig
from torchscale.plan.planned_cell import Cell, KindSettings
from torchscale.results.schema import CellStatus, ResultBase


class CellKind(Protocol):
    """One kind of cell, from the config section it plans to the lines a finished cell prints."""

    name: str
    """The cell kind (``Cell.kind``)."""
    worker_module: str
    """What every rank runs: ``python -m <worker_module>``."""
    record_models: Tuple[Type[ResultBase], ...]
    """The record models its cells write (their ``kind`` fields are the record kinds)."""
    selections: Tuple[str, ...]
    """The ``--benchmark`` choices that run it."""
    profiled: bool
    """Whether ``--profile`` traces its cells."""
    joins_warm_groups: bool
    """Whether its cells can run back to back in one warm process group (``launch: per_group``);
    a kind that sets per-launch state (communicators per scope) gets a launch per cell."""

    def missing(self, config: BenchmarkConfig) -> Optional[str]:
        """Why ``config`` plans none of its cells (a hint on what to add), or None."""
        ...

    def count(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Tuple[int, List[str]]:
        """How many cells at most, from list lengths alone, and the lists that make it."""
        ...

    def plan(
        self, config: BenchmarkConfig, benchmark: str, gpus_per_node: Optional[int]
    ) -> Iterator[KindSettings]:
        """The settings of its cells, in run order, one at a time."""
        ...

    def cell_id(self, settings: KindSettings) -> str:
        """Readable and stable: the same settings always give the same id (what --resume
        matches)."""
        ...

    def swept(self, config: BenchmarkConfig, benchmark: str) -> List[str]:
        """Dotted names of its knobs with more than one value (the plan table's columns)."""
        ...

    def records(
        self, cell: Cell, identity: Dict[str, Any], result: Dict[str, Any]
    ) -> List[ResultBase]:
        """Records of a launch whose rank 0 wrote ``result`` (the worker's result.json)."""
        ...

    def failed(
        self, cell: Cell, identity: Dict[str, Any], status: CellStatus, error: str
    ) -> List[ResultBase]:
        """Records of a launch that produced no result (oom, failed, timeout, skipped)."""
        ...

    def describe(self, cell: Cell, device_kind: str = "cuda") -> str:
        """One line naming the cell: ``resnet50 on 4 GPUs (batch 32, fp32)``; on a node without
        GPUs (``device_kind`` cpu) ``on 4 CPU processes`` (``hardware/device_noun.py``)."""
        ...

    def plan_row(self, cell: Cell, knobs: List[str]) -> List[str]:
        """Its row of the plan table: model, batch, GPUs, precision, then ``knobs``' values."""
        ...

    def console_lines(self, records: List[ResultBase]) -> List[str]:
        """What a finished cell's records add to the console after its own per-record lines."""
        ...


def common_identity(cell: Cell, experiment: str) -> Dict[str, Any]:
    """Fields every record of a cell carries, whatever its kind."""
    s = cell.settings
    return {
        "cell_id": cell.cell_id,
        "experiment": experiment,
        "world_size": s.gpus,
        "nnodes": s.nnodes,
        "nproc_per_node": s.nproc_per_node,
        "repeat": s.repeat,
        "settings": s.model_dump(mode="json"),
    }
