"""The JSON document, in distributed_benchmarks' format: one per experiment (``torchscale report
--format json``) and one per GPU count, ``benchmark_<N>gpu.json``, that the benchmark writes
beside its results: one builder, two callers.

``{name, world_size, timestamp, backend, config, results: {communication, tp_gemm, training,
memory}, profiles}``.
The models below are the document's definition; ``document_schema()`` is its JSON Schema (also in
docs/report-json.schema.json). Figures come from the same tables as summary.csv and the report and
carry the glossary's names (``torchscale.measures.figures``, docs/glossary.md); NaN becomes null,
so the file is strict JSON. Version 2 renamed ``sync_exposed_pct`` to ``sync_overhead_pct`` and
added ``config.ranks``, ``config.note`` and ``profiles``. Version 3 added ``experiment``,
``backend``, ``config.iterations`` (what ran, per kind of cell: ``warmup_iters`` and
``benchmark_iters`` are read from the records, no longer from the config's defaults),
``results.tp_gemm`` and each entry's ``variant`` and ``backend``: every swept setting is part of an
entry's identity (``config.row_identity``). Version 4 added the TP GEMM entries'
``sharded_time_us`` and ``sharded_tflops``.

The kinds' parts (``results.communication`` and ``results.tp_gemm``, each kind's
``config.iterations``) come from the kinds, through ``report.reported_kinds``: the entries'
models are defined here, the document's one schema; the kinds fill them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from torchscale.analysis.report_tables import DocumentTables
from torchscale.hardware.device_noun import cpu_run_note
from torchscale.measures.figures import (
    ALGBW,
    BUSBW,
    COMM_COMPUTE_RATIO,
    COMM_TIME,
    GLOSSARY_DOC,
    GPU_MEMORY_UTILISATION,
    GPU_UTILISATION,
    MFU,
    SCALING_EFFICIENCY,
    STEP_TIME,
    SYNC_OVERHEAD,
    SYNC_STALL,
    THROUGHPUT,
)
from torchscale.measures.table_scalars import frame_records
from torchscale.report import device_words as words
from torchscale.report.reported_kinds import kind_document_results, kind_iterations
from torchscale.results.files import atomic_write_bytes
from torchscale.results.layout import MANIFEST, gpu_document_file
from torchscale.results.schema import ResultBase, TrainingResult

DOCUMENT_VERSION = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


VARIANT_DESCRIPTION = (
    "The settings this entry's configuration differs in from the experiment's other "
    "configurations of its kind (backend=gloo, ddp.bucket_cap_mb=25...); empty when there is one."
)


class Iterations(_Strict):
    """What the cells of one kind ran: every distinct value, smallest first."""

    warmup: List[int] = Field(
        default_factory=list, description="Warm-up steps (training) or untimed ops per size."
    )
    measured: List[int] = Field(
        default_factory=list, description="Measured steps (training) or timed ops per size."
    )


class RunConfig(_Strict):
    """The seed's config keys, from what ran, plus the resolved benchmark configuration."""

    warmup_iters: Optional[int] = Field(
        None,
        description="Warm-up iterations that ran: the training cells' warm-up steps, else the "
        "communication cells' untimed ops per size (the smallest when they differ).",
    )
    benchmark_iters: Optional[int] = Field(
        None,
        description="Measured iterations that ran: the training cells' measured steps, else the "
        "communication cells' timed ops per size (the smallest when they differ).",
    )
    iterations: Dict[str, Iterations] = Field(
        default_factory=dict, description="Per kind of cell (training, communication)."
    )
    device: Optional[str] = Field(None, description="Device name the cells ran on.")
    ranks: str = Field(
        "GPUs", description="What each rank ran on: GPUs, or CPU processes (gloo, no GPU)."
    )
    note: Optional[str] = Field(None, description="On CPU processes: these are not GPU figures.")
    benchmark: Dict[str, Any] = Field(
        default_factory=dict, description=f"The resolved YAML configuration ({MANIFEST})."
    )


class CollectiveEntry(_Strict):
    world_size: int
    variant: str = Field("", description=VARIANT_DESCRIPTION)
    backend: Optional[str] = Field(None, description="The process-group backend that ran it.")
    scope: str
    dtype: str
    size_bytes: Optional[int] = None
    time_us: Optional[float] = None
    algbw_gbps: Optional[float] = Field(None, description=ALGBW.definition)
    busbw_gbps: Optional[float] = Field(None, description=BUSBW.definition)
    status: str


class TpGemmEntry(_Strict):
    """A tensor-parallel GEMM case (DDLB's TPColumnwise) in one order."""

    world_size: int
    variant: str = Field("", description=VARIANT_DESCRIPTION)
    backend: Optional[str] = None
    order: str = Field(description="AG_before (gather A, full GEMM) or AG_after (GEMM, gather C).")
    m: int
    n: int
    k: int
    dtype: str
    time_us: Optional[float] = None
    tflops: Optional[float] = None
    comm_time_us: Optional[float] = None
    gemm_time_us: Optional[float] = None
    comm_share: Optional[float] = None
    reference_time_us: Optional[float] = Field(None, description="The unsharded GEMM on one GPU.")
    sharded_time_us: Optional[float] = Field(
        None,
        description="Compute only, sharded (tp_gemm.compute_only: [.., sharded]): the GEMM each "
        "rank does alone on its m / world_size rows, no communication; the ranks' average.",
    )
    sharded_tflops: Optional[float] = Field(
        None, description="2 (m / world_size) n k / sharded_time_us: one rank's GEMM rate."
    )
    valid: Optional[bool] = None
    status: str


class TrainingEntry(_Strict):
    cell_id: str
    model: str
    variant: str = Field("", description=f"Batch size, then the rest: {VARIANT_DESCRIPTION}")
    backend: Optional[str] = None
    world_size: int
    nnodes: int
    batch_size: int
    global_batch_size: int
    precision: str
    status: str
    error: Optional[str] = None
    unit: Optional[str] = None
    samples_per_s: Optional[float] = None
    throughput: Optional[float] = Field(None, description=THROUGHPUT.definition)
    step_ms_mean: Optional[float] = None
    step_ms_p50: Optional[float] = Field(None, description=STEP_TIME.definition)
    step_ms_p95: Optional[float] = None
    step_ms_p99: Optional[float] = None
    scaling_efficiency: Optional[float] = Field(
        None, description=f"0..1. {SCALING_EFFICIENCY.definition}"
    )
    sync_overhead_pct: Optional[float] = Field(None, description=SYNC_OVERHEAD.definition)
    mfu: Optional[float] = Field(None, description=MFU.definition)
    comm_ms_per_step: Optional[float] = Field(None, description=COMM_TIME.definition)
    comm_compute_ratio: Optional[float] = Field(None, description=COMM_COMPUTE_RATIO.definition)
    gpu_util_pct: Optional[float] = Field(None, description=GPU_UTILISATION.definition)
    gpu_memory_util_pct: Optional[float] = Field(
        None, description=GPU_MEMORY_UTILISATION.definition
    )


class MemoryEntry(_Strict):
    cell_id: str
    model: str
    world_size: int
    batch_size: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_peak_bytes: Optional[int] = None
    peak_bytes: int
    peak_kind: str


class Results(_Strict):
    communication: Dict[str, List[CollectiveEntry]] = Field(
        default_factory=dict, description="By collective (allreduce, allgather, ...), per size."
    )
    tp_gemm: List[TpGemmEntry] = Field(
        default_factory=list, description="Tensor-parallel GEMM cases, per order."
    )
    training: List[TrainingEntry] = Field(default_factory=list, description="One per cell.")
    memory: List[MemoryEntry] = Field(default_factory=list, description="Measured cells' peak.")


class ProfileEntry(_Strict):
    """A traced cell: the experiment's own, or a ``torchscale profile`` run's in its folder."""

    model: Optional[str] = None
    batch_size: Optional[int] = None
    world_size: Optional[int] = None
    traced_by: str = Field(description="benchmark cell, or torchscale profile (a run of its own).")
    tool: Optional[str] = None
    steps: Optional[int] = None
    sync_overhead_pct: Optional[float] = Field(None, description=SYNC_OVERHEAD.definition)
    sync_stall_pct: Optional[float] = Field(None, description=SYNC_STALL.definition)
    findings: int
    folder: str = Field(description="The traced cell's profile folder, relative to the source.")


class BenchmarkDocument(_Strict):
    """One experiment, in distributed_benchmarks' output format."""

    name: str = Field(
        description="The experiment's name, or benchmark_<N>gpu for the benchmark's document of "
        "one GPU count."
    )
    experiment: str = Field("", description="The experiment the results belong to.")
    world_size: int = Field(description="The largest world size measured.")
    timestamp: Optional[str] = Field(None, description="When the results were last written (UTC).")
    backend: Optional[str] = Field(
        None, description="The process-group backend(s) the cells ran with, comma-separated."
    )
    config: RunConfig
    results: Results
    profiles: List[ProfileEntry] = Field(default_factory=list, description="Traced cells.")
    glossary: str = Field(GLOSSARY_DOC, description="Where each figure is defined.")
    torchscale_document_version: int = DOCUMENT_VERSION


def _clean(row: Dict[str, object]) -> Dict[str, object]:
    """NaN and pandas' missing values -> None; numpy scalars -> Python."""
    out = {}
    for key, value in row.items():
        if hasattr(value, "item"):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            value = None
        out[key] = value
    return out


def document_entries(table: Any, model: Any) -> List[Any]:
    """One ``model`` (an entry of the document) per row of ``table``, from the columns it has."""
    fields = set(model.model_fields)
    return [
        model.model_validate({k: v for k, v in _clean(row).items() if k in fields})
        for row in frame_records(table)
    ]


def _iterations(records: List[ResultBase]) -> Dict[str, Iterations]:
    """What ran, per kind, read from the records by each kind: never the config's defaults for
    a kind that did not run."""
    return {
        name: Iterations(warmup=ran.warmup, measured=ran.measured)
        for name, ran in kind_iterations(records).items()
    }


def _first_run(iterations: Dict[str, Iterations], field: str) -> Optional[int]:
    """The smallest value of the first kind, in plan order, that ran: the seed's one number."""
    for ran in iterations.values():
        values: List[int] = getattr(ran, field)
        if values:
            return values[0]
    return None


def _memory(records: List[ResultBase]) -> List[MemoryEntry]:
    entries = []
    for record in records:
        if isinstance(record, TrainingResult) and record.memory is not None:
            entries.append(
                MemoryEntry(
                    cell_id=record.cell_id,
                    model=record.model,
                    world_size=record.world_size,
                    batch_size=record.batch_size,
                    **record.memory.model_dump(),
                )
            )
    return entries


def _profiles(table: pd.DataFrame) -> List[ProfileEntry]:
    fields = set(ProfileEntry.model_fields)
    return [
        ProfileEntry.model_validate({k: v for k, v in _clean(row).items() if k in fields})
        for row in frame_records(table)
    ]


def build_document(tables: DocumentTables) -> BenchmarkDocument:
    """The document of ``tables`` (``analysis.report_tables.document_tables``: one experiment,
    or one GPU count of it)."""
    with words.ranks_on_cpu(tables.on_cpu):
        return _document(tables)


def _document(tables: DocumentTables) -> BenchmarkDocument:
    experiment, records, world_size = tables.experiment, tables.records, tables.world_size
    config = experiment.manifest.get("config") or {}
    named = (getattr(r, "device_name", None) for r in records)
    devices = [name for name in named if name]
    backends = sorted({b for r in records if (b := getattr(r, "backend", None))})
    iterations = _iterations(records)
    profiles = _profiles(tables.profiles)
    return BenchmarkDocument(
        name=experiment.name if world_size is None else f"benchmark_{world_size}gpu",
        experiment=experiment.name,
        world_size=max((r.world_size for r in records), default=0),
        timestamp=experiment.manifest.get("updated_at") or experiment.manifest.get("created_at"),
        backend=", ".join(backends) or None,
        config=RunConfig(
            warmup_iters=_first_run(iterations, "warmup"),
            benchmark_iters=_first_run(iterations, "measured"),
            iterations=iterations,
            device=devices[0] if devices else None,
            ranks=words.devices(),
            note=cpu_run_note() if words.on_cpu() else None,
            benchmark=config,
        ),
        results=Results.model_validate(
            dict(
                training=document_entries(tables.training, TrainingEntry),
                memory=_memory(records),
                **kind_document_results(records),
            )
        ),
        profiles=[p for p in profiles if world_size in (None, p.world_size)],
    )


def document_schema() -> Dict[str, object]:
    return BenchmarkDocument.model_json_schema()


def _json(body: Any) -> bytes:
    return (json.dumps(body, indent=2, allow_nan=False) + "\n").encode("utf-8")


def write_gpu_documents(counts: List[DocumentTables]) -> List[Path]:
    """The benchmark's documents, one per GPU count measured (``counts``: each count's tables),
    in the experiment folder as distributed_benchmarks names them (``benchmark_4gpu.json``);
    returns their paths."""
    written = []
    for tables in counts:
        document = build_document(tables)
        path = tables.experiment.path / gpu_document_file(tables.world_size or 0)
        atomic_write_bytes(path, _json(document.model_dump(mode="json")))
        written.append(path)
    return written


def render_documents(experiments: List[DocumentTables]) -> bytes:
    """The document of the one experiment, or a JSON array of them for a folder of several."""
    documents = [build_document(tables).model_dump(mode="json") for tables in experiments]
    body: Any = documents[0] if len(documents) == 1 else documents
    return _json(body)
