"""What an integration receives during a sweep, and the run names they share.

A sink's failure never costs a result: the records are already in results.jsonl when a sink sees
them, and a sink that raises is reported once on stderr and then left alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence

from torchscale.analysis.stats import finite_number
from torchscale.errors import TorchscaleError
from torchscale.results.schema import ResultBase, TrainingResult

if TYPE_CHECKING:
    from torchscale.launch.sweep import SweepEvents
    from torchscale.plan.cell import Cell

log = logging.getLogger("torchscale")

AXES = {"models", "batch_sizes", "gpu_counts", "nodes", "model", "batch_size", "gpus", "nnodes"}


class ResultSink(Protocol):
    name: str

    def cell_finished(self, records: Sequence[ResultBase], table: Any) -> None:
        """``records``: the cell's records; ``table``: the experiment's training table so far."""

    def close(self, records: Sequence[ResultBase], table: Any) -> None:
        """The sweep is over (or the export done): every record and the final table."""


def _value(settings: Dict[str, Any], dotted: str) -> Any:
    node: Any = settings
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def config_label(record: TrainingResult, swept: Sequence[str]) -> str:
    """``batch4`` plus each swept knob: ``batch4,precision=bf16,ddp.bucket_cap_mb=50``."""
    knobs = [f"{name}={_value(record.settings, name)}" for name in swept if name not in AXES]
    return ",".join([f"batch{record.batch_size}", *knobs])


def cell_run_name(record: TrainingResult, swept: Sequence[str]) -> str:
    """``<experiment>/<model>/<config>/gpus<N>`` (``-nodes<K>``, ``-repeat<R>`` when there):
    runs of one configuration sit side by side in TensorBoard and MLflow."""
    leaf = f"gpus{record.world_size}"
    if record.nnodes > 1:
        leaf += f"-nodes{record.nnodes}"
    if record.repeat:
        leaf += f"-repeat{record.repeat}"
    return "/".join([config_prefix(record, swept), leaf])


def config_prefix(record: TrainingResult, swept: Sequence[str]) -> str:
    from torchscale.plan.matrix import experiment_dirname

    parts = [experiment_dirname(record.experiment), record.model, config_label(record, swept)]
    return "/".join(part.replace("/", "_") for part in parts)


class SinkEvents:
    """Forwards the sweep's events to the console, and each finished cell to the sinks."""

    def __init__(self, inner: SweepEvents, sinks: Sequence[ResultSink]) -> None:
        self.inner = inner
        self.sinks = list(sinks)
        self.broken: Dict[str, str] = {}

    def cell_started(self, cell: Cell, position: int, total: int) -> None:
        self.inner.cell_started(cell, position, total)

    def cell_polled(self, elapsed_s: float) -> None:
        self.inner.cell_polled(elapsed_s)

    def cell_finished(self, cell: Cell, records: List[ResultBase], table: Any) -> None:
        self.inner.cell_finished(cell, records, table)
        if table is None:  # a node that records nothing
            return
        for sink in self.sinks:
            self._call(sink, "cell_finished", records, table)

    def close(self, records: Sequence[ResultBase], table: Any) -> None:
        for sink in self.sinks:
            self._call(sink, "close", records, table)

    def abort(self) -> None:
        """The sweep was interrupted: let the sinks mark their runs as such."""
        for sink in self.sinks:
            if hasattr(sink, "abort"):
                self._call(sink, "abort")

    def _call(self, sink: ResultSink, method: str, *args: Any) -> None:
        if sink.name in self.broken:
            return
        try:
            getattr(sink, method)(*args)
        except Exception as exc:  # an integration must never cost a result
            text = str(exc).strip()
            reason = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
            self.broken[sink.name] = reason
            log.warning(
                "%s logging stopped (%s); the results are safe in results.jsonl and can be "
                "exported later (torchscale report --format ...)",
                sink.name,
                reason,
            )


def cell_figures(record: TrainingResult, row: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """A cell's single figures by name, the same for every sink (TensorBoard tags, MLflow
    metrics); ``row`` is its summary row (sync share, scaling efficiency). Missing ones are left
    out."""
    steps = record.step_time_ms
    row = row or {}
    figures = {
        "throughput": record.throughput,
        "samples_per_s": record.samples_per_s,
        "step_time_ms_mean": steps.mean if steps else None,
        "step_time_ms_p50": steps.p50 if steps else None,
        "step_time_ms_p95": steps.p95 if steps else None,
        "step_time_ms_p99": steps.p99 if steps else None,
        "sync_exposed_pct": row.get("sync_exposed_pct"),
        "scaling_efficiency": row.get("scaling_efficiency"),
        "memory/peak_bytes": record.memory.peak_bytes if record.memory else None,
        "tflops_per_gpu": record.tflops_per_gpu,
        "mfu": record.mfu,
    }
    return {name: v for name, value in figures.items() if (v := finite_number(value)) is not None}


def training_records(records: Sequence[ResultBase]) -> List[TrainingResult]:
    return [r for r in records if isinstance(r, TrainingResult)]


def row_for(table: Any, cell_id: str) -> Optional[Dict[str, Any]]:
    """The training table's row of ``cell_id`` (scaling efficiency is there), or None."""
    if table is None or table.empty:
        return None
    rows = table[table["cell_id"] == cell_id]
    return rows.iloc[-1].to_dict() if len(rows) else None


class Integrations:
    """The integrations asked for on the command line (``--tensorboard``, ``--mlflow``)."""

    def __init__(self, tensorboard: Optional[Path] = None, mlflow: Optional[str] = None) -> None:
        self.tensorboard = tensorboard
        self.mlflow = mlflow

    def check(self) -> None:
        """Fail in one line, before any launch, when a package they need is missing."""
        if self.tensorboard is not None:
            from torchscale.integrations.tensorboard_events import require_tensorboard

            require_tensorboard()
        if self.mlflow is not None:
            from torchscale.integrations.mlflow_runs import require_mlflow

            require_mlflow(self.mlflow)

    def open(self, experiment: str, store_root: Path, swept: Sequence[str]) -> List[ResultSink]:
        sinks: List[ResultSink] = []
        if self.tensorboard is not None:
            from torchscale.integrations.tensorboard_events import TensorBoardSink

            sinks.append(TensorBoardSink(self.tensorboard, swept))
        if self.mlflow is not None:
            from torchscale.integrations.mlflow_runs import MlflowSink

            try:
                sinks.append(MlflowSink(self.mlflow, experiment, store_root, swept))
            except TorchscaleError:
                raise
            except Exception as exc:
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise TorchscaleError(
                    f"--mlflow {self.mlflow}: cannot open the tracking store "
                    f"({type(exc).__name__}: {text[:200]}); give a folder, sqlite:///PATH.db or "
                    "a tracking server URL"
                ) from None
        return sinks
