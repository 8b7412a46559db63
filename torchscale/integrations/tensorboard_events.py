"""TensorBoard event files: ``benchmark --tensorboard DIR`` and ``report --format tensorboard``.

One TensorBoard run per cell, named from its settings (``<experiment>/<model>/batch4,.../gpus2``)
so TensorBoard's own run comparison lines cells up. Per cell:

- ``step_time_ms`` at every measured step (the slowest rank's time) and its histogram
  ``step_time_ms_hist``;
- ``sync_wait_ms/rank<R>`` each rank's exposed gradient-sync wait at every step;
- the cell's single figures at step 0 (``integrations.sinks.cell_figures``, the same names as
  the MLflow metrics): ``throughput`` (unit/s, all ranks), ``samples_per_s``,
  ``step_time_ms_mean``/``p50``/``p95``/``p99``, ``sync_overhead_pct``, ``scaling_efficiency``,
  ``memory/peak_bytes``, ``tflops_per_gpu``, ``mfu``, and the Distributed Training Profiler's
  ``comm/time_per_step_ms`` (DDP's gradient communication per step), ``comm/compute_ratio``,
  ``gpu/util_pct`` and ``gpu/memory_util_pct`` (NVML: GPU cells only).

And one ``.../scaling`` run per configuration: ``scaling/throughput`` and
``scaling/efficiency`` with the GPU count as the step, so the scaling curve is a TensorBoard plot.
Needs the ``tensorboard`` package (``pip install 'torchscale[tensorboard]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from torchscale.errors import TorchscaleError
from torchscale.integrations.run_names import (
    cell_figures,
    cell_run_name,
    config_prefix,
    row_for,
    training_records,
)
from torchscale.measures.stats import finite_number
from torchscale.results.schema import ResultBase, TrainingResult

if TYPE_CHECKING:
    import pandas as pd

INSTALL_HINT = "pip install 'torchscale[tensorboard]'"


def require_tensorboard() -> None:
    """Fail in one line, before any work, when the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise TorchscaleError(
            f"TensorBoard output needs the tensorboard package: {INSTALL_HINT}"
        ) from None


def _writer(path: Path) -> Any:
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(path))


def write_cell(root: Path, record: TrainingResult, swept: Sequence[str], row: Any) -> Path:
    """One cell's run under ``root``; returns its folder."""
    path = root / cell_run_name(record, swept)
    writer = _writer(path)
    try:
        for tag, value in cell_figures(record, row).items():
            writer.add_scalar(tag, value, 0)
        for step, step_ms in enumerate(record.step_times_ms):
            writer.add_scalar("step_time_ms", step_ms, step)
        if record.step_times_ms:
            import numpy as np

            writer.add_histogram("step_time_ms_hist", np.asarray(record.step_times_ms), 0)
        for rank in record.per_rank:
            for step, wait in enumerate(rank.sync_wait_samples_ms):
                writer.add_scalar(f"sync_wait_ms/rank{rank.rank}", wait, step)
    finally:
        writer.close()
    return path


def write_scaling(
    root: Path,
    records: Sequence[TrainingResult],
    swept: Sequence[str],
    table: Optional[pd.DataFrame],
) -> None:
    """Per configuration, throughput and efficiency against the GPU count (repeats averaged)."""
    groups: Dict[str, Dict[int, List[Tuple[float, Optional[float]]]]] = {}
    for record in records:
        row = row_for(table, record.cell_id)
        if record.status != "ok" or record.throughput is None or record.nnodes > 1:
            continue
        efficiency = finite_number((row or {}).get("scaling_efficiency"))
        by_size = groups.setdefault(config_prefix(record, swept), {})
        by_size.setdefault(record.world_size, []).append((record.throughput, efficiency))
    for prefix, by_size in groups.items():
        writer = _writer(root / prefix / "scaling")
        try:
            for size in sorted(by_size):
                figures = by_size[size]
                writer.add_scalar(
                    "scaling/throughput", sum(f[0] for f in figures) / len(figures), size
                )
                found = [f[1] for f in figures if f[1] is not None]
                if found:
                    writer.add_scalar("scaling/efficiency", sum(found) / len(found), size)
        finally:
            writer.close()


class TensorBoardSink:
    """``benchmark --tensorboard DIR``: each cell's run as soon as the cell is recorded."""

    name = "TensorBoard"
    remote = False  # event files on local disk

    def __init__(self, root: Path, swept: Sequence[str]) -> None:
        require_tensorboard()
        self.root = Path(root)
        self.swept = list(swept)

    def cell_finished(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        for record in training_records(records):
            if record.status == "ok":
                write_cell(self.root, record, self.swept, row_for(table, record.cell_id))

    def close(self, records: Sequence[ResultBase], table: Optional[pd.DataFrame]) -> None:
        write_scaling(self.root, training_records(records), self.swept, table)


def export_tensorboard(data: Any, root: Path) -> Path:
    """``report --format tensorboard``: every experiment of ``data`` (ReportData) into ``root``."""
    from torchscale.analysis.training_tables import training_table

    require_tensorboard()
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise TorchscaleError(f"--output {root} is a file; TensorBoard output is a folder")
    for experiment in data.experiments:
        swept = experiment.manifest.get("swept") or []
        table = training_table(experiment.records)
        sink = TensorBoardSink(root, swept)
        sink.cell_finished(experiment.records, table)
        sink.close(experiment.records, table)
    return root
