"""MLflow tracking: ``benchmark --mlflow URI``.

One parent run per experiment sweep and one child run per cell (tag ``mlflow.parentRunId``), in the
MLflow experiment named like the torchscale experiment. A child run has the cell's settings as
parameters, its figures as metrics (``step_time_ms`` as a history over the measured steps),
its status (FAILED for failed/oom/timeout cells, KILLED for skipped ones, the reason in the
``torchscale.error`` tag) and its ``result.json``/``cell.json`` as artifacts. The parent run gets
the swept knobs as parameters and, at the end, ``summary.csv``, ``manifest.json`` and the
JSON document (``report.json``) as artifacts.

URI: a local folder or its ``file:///path`` form (MLflow's file store, which MLflow 3 keeps in
maintenance mode: torchscale opts in for you), ``sqlite:///path/mlflow.db`` (artifacts beside it,
in ``mlartifacts/``), or an ``http(s)://`` tracking server. Every request has the integrations'
deadline and no retries (:func:`bound_requests`). Needs ``pip install 'torchscale[mlflow]'``.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from torchscale.config.base import flatten_settings
from torchscale.errors import TorchscaleError
from torchscale.integrations.run_names import (
    cell_figures,
    cell_run_name,
    row_for,
    training_records,
)
from torchscale.results.layout import (
    CELL_FILE,
    MANIFEST,
    REPORT_EXPORT,
    RESULT_FILE,
    SUMMARY,
    cell_dir,
)
from torchscale.results.schema import ResultBase, TrainingResult

if TYPE_CHECKING:
    import pandas as pd
    from pandas import DataFrame

INSTALL_HINT = "pip install 'torchscale[mlflow]'"
RUN_STATUS = {"ok": "FINISHED", "skipped": "KILLED"}  # others (failed, oom, timeout): FAILED
MAX_PARAM_CHARS = 500
PARENT_TAG = "mlflow.parentRunId"


def require_mlflow(uri: str) -> None:
    """Fail in one line, before any launch, when MLflow (or its SQL store) is missing."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise TorchscaleError(f"--mlflow needs the mlflow package: {INSTALL_HINT}") from None
    if uri.startswith(("sqlite:", "postgresql:", "mysql:", "mssql:")):
        try:
            import alembic  # noqa: F401
            import sqlalchemy  # noqa: F401
        except ImportError:
            raise TorchscaleError(
                f"--mlflow {uri} is a database store, which needs sqlalchemy and alembic: "
                f"{INSTALL_HINT}"
            ) from None


def _file_uri_path(uri: str) -> Optional[str]:
    """The folder of a ``file:`` URI (``file:///x/y``, ``file:/x/y``, ``file://localhost/x``)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    return urllib.request.url2pathname(parsed.path)


def tracking_uri(uri: str) -> str:
    """A folder path, or MLflow's own ``file://`` form of one, becomes an absolute file store
    path; other URIs are kept."""
    folder = _file_uri_path(uri)
    if folder is None and ("://" in uri or uri.startswith("sqlite:")):
        return uri
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the user asked for a folder
    return str(Path(folder or uri).expanduser().resolve())


def server_url(uri: str) -> Optional[str]:
    """For a tracking server (``http(s)://``), the URL that tells whether it is there."""
    if not uri.lower().startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/health"


def bound_requests(timeout_s: float) -> None:
    """MLflow's HTTP client: at most ``timeout_s`` a request and no retries (its defaults: 120 s
    and 7 retries with back-off, minutes of silence for a dead server); a user's own settings of
    these variables are kept."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, math.ceil(timeout_s))))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


def _artifact_location(uri: str) -> Optional[str]:
    """For ``sqlite:///x/mlflow.db``: ``x/mlartifacts`` (MLflow would use ./mlruns of the cwd)."""
    if uri.startswith("sqlite:///"):
        database = Path(uri[len("sqlite:///") :])
        return (database.parent / "mlartifacts").resolve().as_uri()
    return None


def _params(values: Dict[str, object]) -> Dict[str, str]:
    return {key: str(value)[:MAX_PARAM_CHARS] for key, value in flatten_settings(values)}


class MlflowSink:
    """Logs each recorded cell as a child run of the sweep's parent run."""

    name = "MLflow"

    def __init__(self, uri: str, experiment: str, store_root: Path, swept: Sequence[str]) -> None:
        require_mlflow(uri)
        from mlflow import MlflowClient

        self.uri = tracking_uri(uri)
        self.remote = server_url(self.uri) is not None  # else a folder or a database file
        self.client = MlflowClient(tracking_uri=self.uri)
        self.store_root = Path(store_root)
        self.swept = list(swept)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(
                experiment, artifact_location=_artifact_location(self.uri)
            )
        )
        parent = self.client.create_run(
            self.experiment_id,
            run_name=experiment,
            tags={"torchscale.kind": "experiment", "torchscale.results_dir": str(store_root)},
        )
        self.parent_id = parent.info.run_id
        self.client.log_batch(self.parent_id, params=self._param_list({"swept": ",".join(swept)}))
        self.cell_runs: Dict[str, str] = {}

    @staticmethod
    def _param_list(values: Dict[str, object]) -> List[Any]:
        from mlflow.entities import Param

        return [Param(key, value) for key, value in _params(values).items()]

    def cell_finished(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        for record in training_records(records):
            self._log_cell(record, row_for(table, record.cell_id))

    def _log_cell(self, record: TrainingResult, row: Optional[Dict[str, object]]) -> None:
        from mlflow.entities import Metric

        name = cell_run_name(record, self.swept).split("/", 1)[1]  # the experiment is the parent
        tags = {
            PARENT_TAG: self.parent_id,
            "torchscale.kind": "cell",
            "torchscale.cell_id": record.cell_id,
            "torchscale.status": record.status,
        }
        if record.error:
            tags["torchscale.error"] = record.error[:5000]
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        run_id = run.info.run_id
        self.cell_runs[record.cell_id] = run_id
        params = {
            **record.settings,
            "world_size": record.world_size,
            "backend": record.backend,
            "device_name": record.device_name,
        }
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in cell_figures(record, row).items()]
        metrics += [
            Metric("step_time_ms", float(ms), now, step)
            for step, ms in enumerate(record.step_times_ms)
        ]
        self.client.log_batch(run_id, metrics=metrics[:1000], params=self._param_list(params))
        for extra in range(1000, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[extra : extra + 1000])
        folder = cell_dir(self.store_root, record.cell_id)
        for artifact in (RESULT_FILE, CELL_FILE):
            if (folder / artifact).is_file():
                self.client.log_artifact(run_id, str(folder / artifact))
        self.client.set_terminated(run_id, RUN_STATUS.get(record.status, "FAILED"))

    def close(self, records: Sequence[ResultBase], table: Optional[DataFrame]) -> None:
        for name in (SUMMARY, MANIFEST):
            if (self.store_root / name).is_file():
                self.client.log_artifact(self.parent_id, str(self.store_root / name))
        self._log_document()
        ok = sum(1 for r in training_records(records) if r.status == "ok")
        self.client.log_metric(self.parent_id, "cells_ok", ok)
        self.client.set_terminated(self.parent_id, "FINISHED")

    def abort(self) -> None:
        """Interrupted: the parent run ends KILLED (the finished cells' runs stay as logged)."""
        self.client.set_terminated(self.parent_id, "KILLED")

    def _log_document(self) -> None:
        """The experiment's JSON document (distributed_benchmarks' format), as ``report.json``."""
        import tempfile

        from torchscale.analysis.report_data import load_experiment
        from torchscale.analysis.report_tables import document_tables
        from torchscale.report.document import build_document

        experiment = load_experiment(self.store_root)
        document = build_document(document_tables(experiment)).model_dump(mode="json")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / REPORT_EXPORT
            path.write_text(json.dumps(document, indent=2), encoding="utf-8")
            self.client.log_artifact(self.parent_id, str(path))
