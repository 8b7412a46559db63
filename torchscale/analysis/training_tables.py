"""Result records -> pandas tables, and scaling efficiency (defined here and nowhere else).

Scaling efficiency compares cells that differ only in GPU count:
``efficiency(N) = throughput_N / (N / B * throughput_B)`` with B the smallest GPU count measured for
that configuration, on the fewest nodes (1 when a 1-GPU cell exists: then
``throughput_N / (N * throughput_1)``). Repeats are averaged first. It needs two GPU counts (or
node layouts) of the same configuration: a configuration measured at one count has none (NaN,
shown as "–"), not 100%. ``analysis/node_scaling.py`` splits it into intra- and inter-node
factors with the same :func:`efficiency`.

Sync overhead (``sync_overhead_pct``) likewise needs two ranks: one rank has no gradient sync, so
:func:`sync_overhead_pct` is None there whatever the record holds.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import pandas as pd

from torchscale.analysis.device_utilisation import cell_gpu_memory_util_pct, cell_gpu_util_pct
from torchscale.analysis.iteration_breakdown import cell_comm_compute
from torchscale.analysis.scaling import label_variants
from torchscale.config.row_identity import configuration_key
from torchscale.results.schema import ResultBase, TrainingResult

TRAINING_COLUMNS = [
    "cell_id", "experiment", "model", "batch_size", "grad_accum_steps", "global_batch_size",
    "world_size", "nnodes", "nproc_per_node", "precision", "repeat", "status", "error", "unit",
    "samples_per_s", "throughput", "step_ms_mean", "step_ms_p50", "step_ms_p95", "step_ms_p99",
    "step_ms_cv", "sync_overhead_pct", "slowest_rank", "peak_memory_bytes", "tflops_per_gpu",
    "mfu", "gpu_util_pct", "gpu_memory_util_pct", "comm_ms_per_step", "comm_compute_ratio",
    "device_name", "hosts", "config_key", "strategy", "model_state_bytes", "gradient_error",
    "collective_bytes",
]  # fmt: skip


MEASURED_WINDOW_FIELDS = {"warmup_steps", "measure_steps", "measure_seconds", "sync_probe_steps"}
"""How long a cell measures: ``torchscale profile`` runs a window of its own."""


def config_key(settings: Dict[str, object]) -> str:
    """Identifies a configuration apart from its GPU count (and repeat): ``config.row_identity``,
    the one definition of a row's identity."""
    return configuration_key(settings)


def profiled_config_key(settings: Dict[str, object]) -> str:
    """A configuration apart from its GPU count and measured window: what a ``torchscale
    profile`` run of a benchmark's configuration shares with the benchmark's cells."""
    return config_key({k: v for k, v in settings.items() if k not in MEASURED_WINDOW_FIELDS})


def sync_overhead_pct(record: TrainingResult) -> Optional[float]:
    """The record's sync overhead in percent (``docs/glossary.md``); None on one rank, where there
    is no gradient sync and the no_sync probe measures only noise and DDP's bucketing."""
    sync = record.sync
    if record.world_size < 2 or sync is None or sync.exposed_fraction is None:
        return None
    return 100 * sync.exposed_fraction


def _row(record: TrainingResult) -> Dict[str, object]:
    steps = record.step_time_ms
    sync = record.sync
    comm_ms, comm_ratio = cell_comm_compute(record) if record.world_size > 1 else (None, None)
    return {
        "cell_id": record.cell_id,
        "experiment": record.experiment,
        "model": record.model,
        "batch_size": record.batch_size,
        "grad_accum_steps": record.grad_accum_steps,
        "global_batch_size": record.global_batch_size,
        "world_size": record.world_size,
        "nnodes": record.nnodes,
        "nproc_per_node": record.nproc_per_node,
        "precision": record.precision,
        "repeat": record.repeat,
        "status": record.status,
        "error": record.error,
        "unit": record.unit,
        "samples_per_s": record.samples_per_s,
        "throughput": record.throughput,
        "step_ms_mean": steps.mean if steps else None,
        "step_ms_p50": steps.p50 if steps else None,
        "step_ms_p95": steps.p95 if steps else None,
        "step_ms_p99": steps.p99 if steps else None,
        "step_ms_cv": steps.cv if steps else None,
        "sync_overhead_pct": sync_overhead_pct(record),
        "slowest_rank": sync.slowest_rank if sync else None,
        "peak_memory_bytes": record.memory.peak_bytes if record.memory else None,
        "tflops_per_gpu": record.tflops_per_gpu,
        "mfu": record.mfu,
        "gpu_util_pct": cell_gpu_util_pct(record),
        "gpu_memory_util_pct": cell_gpu_memory_util_pct(record),
        "comm_ms_per_step": comm_ms,
        "comm_compute_ratio": comm_ratio,
        "device_name": record.device_name,
        "hosts": " ".join(record.hosts),
        "config_key": config_key(record.settings),
        "strategy": record.settings.get("strategy", "ddp"),
        "model_state_bytes": model_state_bytes(record),
        "gradient_error": record.gradient_check.relative_error if record.gradient_check else None,
        "collective_bytes": sum(c.bytes for c in record.collectives)
        if record.collectives
        else None,
    }


def model_state_bytes(record: TrainingResult) -> Optional[int]:
    """Parameters, gradients and optimizer state one rank holds (``docs/glossary.md``)."""
    memory = record.memory
    if memory is None:
        return None
    return memory.params_bytes + memory.grads_bytes + memory.optimizer_bytes


def training_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per training cell, with scaling efficiency against its baseline and its
    configuration's label (``variant``: a sweep's cells are never two rows alike)."""
    rows: List[Dict[str, object]] = [_row(r) for r in records if isinstance(r, TrainingResult)]
    table = pd.DataFrame(rows, columns=TRAINING_COLUMNS)
    return label_variants(add_scaling_efficiency(table))


def efficiency(rate: Any, size: Any, base_rate: Any, base_size: Any) -> Any:
    """Throughput over the ideal: the baseline's throughput scaled by ``size / base_size``."""
    return rate / (size / base_size * base_rate)


def add_scaling_efficiency(table: pd.DataFrame) -> pd.DataFrame:
    """Add ``scaling_efficiency`` and ``baseline_world_size`` (NaN where no baseline: a
    configuration measured at a single GPU count and node layout has nothing to scale against)."""
    table = table.copy()
    table["scaling_efficiency"] = float("nan")
    table["baseline_world_size"] = float("nan")
    ok = table[(table["status"] == "ok") & table["samples_per_s"].notna()]
    if ok.empty:
        return table
    # The same GPU count may run on one node and on several: they are different cells.
    mean_rate = ok.groupby(["config_key", "world_size", "nnodes"])["samples_per_s"].mean()
    for key, by_size in mean_rate.groupby(level=0):
        by_size = by_size.droplevel(0)
        if len(by_size) < 2:
            continue
        base_size, base_nodes = min(by_size.index)
        base_rate = float(by_size.loc[(base_size, base_nodes)])
        rows = (table["config_key"] == key) & (table["status"] == "ok")
        sizes = table.loc[rows, "world_size"].astype(float)
        rates = table.loc[rows, "samples_per_s"].astype(float)
        table.loc[rows, "scaling_efficiency"] = efficiency(rates, sizes, base_rate, int(base_size))
        table.loc[rows, "baseline_world_size"] = int(base_size)
    return table
