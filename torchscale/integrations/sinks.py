"""What an integration receives during a sweep (run names and figures: ``run_names``).

A sink's failure never costs a result: the records are already in results.jsonl when a sink sees
them, and a sink that raises is reported once on stderr and then left alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence

from torchscale.errors import TorchscaleError
from torchscale.results.layout import RESULTS
from torchscale.results.schema import ResultBase

if TYPE_CHECKING:
    import pandas as pd

    from torchscale.launch.sweep import SweepEvents
    from torchscale.plan.planned_cell import Cell

log = logging.getLogger("torchscale")


class ResultSink(Protocol):
    name: str

    def cell_finished(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        """``records``: the cell's records; ``table``: the experiment's training table so far."""

    def close(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        """The sweep is over (or the export done): every record and the final table."""


class SinkEvents:
    """Forwards the sweep's events to the console, and each finished cell to the sinks."""

    def __init__(self, inner: SweepEvents, sinks: Sequence[ResultSink]) -> None:
        self.inner = inner
        self.sinks = list(sinks)
        self.broken: Dict[str, str] = {}

    def cell_started(self, cell: Cell, position: int, total: int, cell_dir: Path) -> None:
        self.inner.cell_started(cell, position, total, cell_dir)

    def cell_polled(self, elapsed_s: float) -> None:
        self.inner.cell_polled(elapsed_s)

    def cell_finished(
        self, cell: Cell, records: List[ResultBase], table: Optional[pd.DataFrame]
    ) -> None:
        self.inner.cell_finished(cell, records, table)
        if table is None:  # a node that records nothing
            return
        for sink in self.sinks:
            self._call(sink, "cell_finished", records, table)

    def close(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
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
                "%s logging stopped (%s); the results are safe in %s and can be "
                "exported later (torchscale report --format ...)",
                sink.name,
                reason,
                RESULTS,
            )


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
