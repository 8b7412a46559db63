"""What an integration receives during a sweep (run names and figures: ``run_names``).

A sink's failure never costs a result: the records are already in results.jsonl when a sink sees
them, and a sink that raises is reported once on stderr and then left alone. Every call into a
sink has a deadline (``integrations.deadline``, ``--integration-timeout``): one that does not
answer in time is reported once and left alone too, so a server that dies mid-sweep costs the
deadline once. Before the first cell, a tracking server is asked whether it is there: one that
cannot be reached is one warning, and the benchmark runs without it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence

from torchscale.errors import TorchscaleError
from torchscale.integrations.deadline import (
    DEFAULT_TIMEOUT_S,
    Unanswered,
    call_with_deadline,
    local_deadline,
    unreachable,
)
from torchscale.results.layout import RESULTS
from torchscale.results.schema import ResultBase

if TYPE_CHECKING:
    import pandas as pd

    from torchscale.launch.sweep import SweepEvents
    from torchscale.plan.planned_cell import Cell

log = logging.getLogger("torchscale")


class ResultSink(Protocol):
    name: str
    remote: bool  # calls wait on a server (the timeout), not on local disk (the local deadline)

    def cell_finished(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        """``records``: the cell's records; ``table``: the experiment's training table so far."""

    def close(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        """The sweep is over (or the export done): every record and the final table."""


class SinkEvents:
    """Forwards the sweep's events to the console, and each finished cell to the sinks."""

    def __init__(
        self,
        inner: SweepEvents,
        sinks: Sequence[ResultSink],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.inner = inner
        self.sinks = list(sinks)
        self.timeout_s = timeout_s
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
            deadline = (
                self.timeout_s if getattr(sink, "remote", True) else local_deadline(self.timeout_s)
            )
            call_with_deadline(deadline, getattr(sink, method), *args)
        except Exception as exc:  # an integration must never cost a result
            text = str(exc).strip()
            reason = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
            if isinstance(exc, Unanswered):
                reason = f"{text}; --integration-timeout sets the limit"
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

    def __init__(
        self,
        tensorboard: Optional[Path] = None,
        mlflow: Optional[str] = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.tensorboard = tensorboard
        self.mlflow = mlflow
        self.timeout_s = timeout_s

    def check(self) -> None:
        """Fail in one line, before any launch, when a package they need is missing."""
        if self.tensorboard is not None:
            from torchscale.integrations.tensorboard_events import require_tensorboard

            require_tensorboard()
        if self.mlflow is not None:
            from torchscale.integrations.mlflow_runs import require_mlflow

            require_mlflow(self.mlflow)

    def open(self, experiment: str, store_root: Path, swept: Sequence[str]) -> List[ResultSink]:
        """The sinks that answer; one that cannot be reached (or set up) within the deadline is
        one warning and is left out. A tracking store that answers with an error is bad input."""
        sinks: List[ResultSink] = []
        if self.tensorboard is not None:
            from torchscale.integrations.tensorboard_events import TensorBoardSink

            sink = self._opened("TensorBoard", False, TensorBoardSink, self.tensorboard, swept)
            sinks += [sink] if sink is not None else []
        if self.mlflow is not None:
            sink = self._mlflow(experiment, store_root, swept)
            sinks += [sink] if sink is not None else []
        return sinks

    def _mlflow(self, experiment: str, store_root: Path, swept: Sequence[str]) -> Optional[Any]:
        from torchscale.integrations.mlflow_runs import MlflowSink, bound_requests, server_url

        uri = self.mlflow or ""
        bound_requests(self.timeout_s)
        url = server_url(uri)
        reason = unreachable(url, self.timeout_s) if url else None
        if reason:
            self._left_out("MLflow", f"{url} cannot be reached: {reason}")
            return None
        try:
            remote = url is not None
            return self._opened("MLflow", remote, MlflowSink, uri, experiment, store_root, swept)
        except TorchscaleError:
            raise
        except Exception as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise TorchscaleError(
                f"--mlflow {uri}: cannot open the tracking store "
                f"({type(exc).__name__}: {text[:200]}); give a folder, sqlite:///PATH.db or "
                "a tracking server URL"
            ) from None

    def _opened(self, name: str, remote: bool, factory: Any, *args: Any) -> Optional[Any]:
        deadline = self.timeout_s if remote else local_deadline(self.timeout_s)
        try:
            return call_with_deadline(deadline, factory, *args)
        except Unanswered as exc:
            self._left_out(name, f"setting it up got {exc}")
        except OSError as exc:
            self._left_out(name, f"{type(exc).__name__}: {exc}")
        return None

    def _left_out(self, name: str, reason: str) -> None:
        log.warning(
            "%s logging is off for this run (%s); the benchmark goes on and the results are "
            "safe in %s",
            name,
            reason,
            RESULTS,
        )
