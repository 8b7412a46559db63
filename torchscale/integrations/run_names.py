"""The names and figures every integration gives a training cell: run names that put runs of one
configuration side by side (TensorBoard, MLflow), and the cell's single figures by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from torchscale.measures.stats import finite_number
from torchscale.results.schema import ResultBase, TrainingResult

if TYPE_CHECKING:
    from pandas import DataFrame

AXES = {"models", "batch_sizes", "gpu_counts", "nodes", "model", "batch_size", "gpus", "nnodes"}


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
    from torchscale.results.layout import experiment_dirname

    parts = [experiment_dirname(record.experiment), record.model, config_label(record, swept)]
    return "/".join(part.replace("/", "_") for part in parts)


def cell_figures(record: TrainingResult, row: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """A cell's single figures by name, the same for every sink (TensorBoard tags, MLflow
    metrics); ``row`` is its summary row (sync share, scaling efficiency). Missing ones are left
    out."""
    steps = record.step_time_ms
    row = row or {}
    # Only a cell measured against a smaller GPU count has a scaling figure (as on the console):
    # the baseline's own 100% is a definition, and a cell recorded live has no later counts yet.
    baseline = finite_number(row.get("baseline_world_size"))
    scaled = baseline is not None and baseline < record.world_size
    figures = {
        "throughput": record.throughput,
        "samples_per_s": record.samples_per_s,
        "step_time_ms_mean": steps.mean if steps else None,
        "step_time_ms_p50": steps.p50 if steps else None,
        "step_time_ms_p95": steps.p95 if steps else None,
        "step_time_ms_p99": steps.p99 if steps else None,
        "sync_overhead_pct": row.get("sync_overhead_pct"),
        "scaling_efficiency": row.get("scaling_efficiency") if scaled else None,
        "memory/peak_bytes": record.memory.peak_bytes if record.memory else None,
        "tflops_per_gpu": record.tflops_per_gpu,
        "mfu": record.mfu,
        # The Distributed Training Profiler's metrics: communication per step and against compute
        # (DDP's logging), GPU and GPU memory utilisation (NVML; absent on CPU processes).
        "comm/time_per_step_ms": row.get("comm_ms_per_step"),
        "comm/compute_ratio": row.get("comm_compute_ratio"),
        "gpu/util_pct": row.get("gpu_util_pct"),
        "gpu/memory_util_pct": row.get("gpu_memory_util_pct"),
    }
    return {name: v for name, value in figures.items() if (v := finite_number(value)) is not None}


def training_records(records: Sequence[ResultBase]) -> List[TrainingResult]:
    return [r for r in records if isinstance(r, TrainingResult)]


def row_for(table: Optional[DataFrame], cell_id: str) -> Optional[Dict[str, Any]]:
    """The training table's row of ``cell_id`` (scaling efficiency is there), or None."""
    if table is None or table.empty:
        return None
    rows = table[table["cell_id"] == cell_id]
    return {str(k): v for k, v in rows.iloc[-1].to_dict().items()} if len(rows) else None
