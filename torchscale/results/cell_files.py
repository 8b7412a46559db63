"""A training cell's own summary files, for tools that read one folder per run (the GPU Training
Benchmark Suite's ``results/<exp>/<run>/run_summary.json`` and ``metrics_epoch.jsonl``), written
into the cell's folder from its record once the record is safe in ``results.jsonl`` (the source
of truth; these are views of it, rewritten whole and atomically).

- ``run_summary.json``: what ran (model, ranks, batch, precision, backend, settings, timing
  mode), how it went (status, error) and the headline figures (throughput, step time, MFU, peak
  memory); the node's environment is the experiment's ``manifest.json``.
- ``metrics_epoch.jsonl``: with ``epochs``, one line per measured pass over the data.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from torchscale.results.files import atomic_write_json, atomic_write_text, dumps
from torchscale.results.layout import MANIFEST, METRICS_EPOCH, RUN_SUMMARY
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.results.store import ExperimentStore

SUMMARY_FIELDS = (
    "cell_id", "experiment", "status", "error", "model", "world_size", "nnodes", "batch_size",
    "grad_accum_steps", "global_batch_size", "precision", "backend", "device_name", "hosts",
    "warmup_steps", "measure_steps", "measured_s", "unit", "samples_per_s", "throughput",
    "step_time_ms", "tflops_per_gpu", "mfu", "started_at", "finished_at", "wall_s", "settings",
)  # fmt: skip


def run_summary(record: TrainingResult) -> Dict[str, Any]:
    """The cell's ``run_summary.json``."""
    summary = record.model_dump(mode="json", include=set(SUMMARY_FIELDS))
    summary = {name: summary.get(name) for name in SUMMARY_FIELDS}
    summary.update(
        epochs=len(record.epochs) or None,
        epoch_samples_per_s=[epoch.samples_per_s for epoch in record.epochs],
        sync_cuda=bool(record.settings.get("sync_cuda", False)),
        peak_memory_bytes=record.memory.peak_bytes if record.memory else None,
        environment=f"../../{MANIFEST}",
    )
    return summary


def write_cell_files(store: ExperimentStore, records: Sequence[ResultBase]) -> None:
    """Write the summary files of every launched training cell among ``records``."""
    for record in records:
        if not isinstance(record, TrainingResult):
            continue
        folder = store.cell_dir(record.cell_id)
        if not folder.is_dir():  # skipped before any launch: no run, no folder
            continue
        atomic_write_json(folder / RUN_SUMMARY, run_summary(record))
        if record.epochs:
            lines = [
                dumps({"cell_id": record.cell_id, "unit": record.unit, **epoch.model_dump()})
                for epoch in record.epochs
            ]
            atomic_write_text(folder / METRICS_EPOCH, "\n".join(lines) + "\n")
