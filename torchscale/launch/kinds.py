"""Cell kinds: which worker a cell launches, and how its output becomes result records.

Training cells make one record each. Other kinds plug in here (a communication sweep launches
once per GPU count and writes one record per collective x message size): each module listed in
``KIND_MODULES`` defines a ``CellKind`` named ``KIND``.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Protocol

from torchscale.plan.matrix import Cell
from torchscale.results.schema import CellStatus, ResultBase, TrainingResult

KIND_MODULES = {
    "training": "torchscale.launch.kinds",
    "communication": "torchscale.comm.kind",
}


class CellKind(Protocol):
    """What the launcher needs to know about one kind of cell."""

    name: str
    worker_module: str

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


class TrainingKind:
    name = "training"
    worker_module = "torchscale.worker"

    @staticmethod
    def _fields(cell: Cell) -> Dict[str, Any]:
        s = cell.settings
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
        from torchscale.models.registry import describe

        entry = describe(cell.settings.model)  # a built-in model's unit is known without a run
        unit = entry.unit if entry else None
        return [
            TrainingResult(**identity, **self._fields(cell), unit=unit, status=status, error=error)
        ]


KIND = TrainingKind()


def get_kind(name: str) -> CellKind:
    module = importlib.import_module(KIND_MODULES[name])
    kind: CellKind = module.KIND
    return kind
