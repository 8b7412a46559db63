"""Seed 001's JSON document, one per experiment: ``torchscale report --format json``.

``{name, world_size, timestamp, config, results: {communication, training, memory}, profiles}``.
The models below are the document's definition; ``document_schema()`` is its JSON Schema (also in
docs/report-json.schema.json). Figures come from the same tables as summary.csv and the report and
carry the glossary's names (``torchscale.results.figures``, docs/glossary.md); NaN becomes null,
so the file is strict JSON. Version 2 renamed ``sync_exposed_pct`` to ``sync_overhead_pct`` and
added ``config.ranks``, ``config.note`` and ``profiles``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field

from torchscale.analysis.training_tables import training_table
from torchscale.hardware.device_noun import cpu_run_note
from torchscale.report import device_words as words
from torchscale.report.profile_section import profile_table
from torchscale.report.report_data import Experiment, ReportData
from torchscale.report.reported_kinds import kind_document_results
from torchscale.results.figures import (
    ALGBW,
    BUSBW,
    GLOSSARY_DOC,
    MFU,
    SCALING_EFFICIENCY,
    STEP_TIME,
    SYNC_OVERHEAD,
    SYNC_STALL,
    THROUGHPUT,
)
from torchscale.results.layout import MANIFEST
from torchscale.results.schema import TrainingResult
from torchscale.results.table_scalars import frame_records

if TYPE_CHECKING:
    import pandas as pd

DOCUMENT_VERSION = 2
OP_KEYS = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
    "all_to_all": "alltoall",
    "send_recv": "p2p",
}
"""torchscale's collective names -> the seed's keys (``allreduce``, ``allgather``...)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunConfig(_Strict):
    """The seed's config keys, plus the resolved benchmark configuration."""

    warmup_iters: Optional[int] = Field(None, description="warmup_steps (first value if swept).")
    benchmark_iters: Optional[int] = Field(None, description="measure_steps (first if swept).")
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
    scope: str
    dtype: str
    size_bytes: Optional[int] = None
    time_us: Optional[float] = None
    algbw_gbps: Optional[float] = Field(None, description=ALGBW.definition)
    busbw_gbps: Optional[float] = Field(None, description=BUSBW.definition)
    status: str


class TrainingEntry(_Strict):
    cell_id: str
    model: str
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
    """One experiment, in seed 001's output format."""

    name: str
    world_size: int = Field(description="The largest world size measured.")
    timestamp: Optional[str] = Field(None, description="When the results were last written (UTC).")
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


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value if value != [] else None


def communication_entries(table: pd.DataFrame) -> Dict[str, List[CollectiveEntry]]:
    """``results.communication`` from the collectives table (the communication kind's part of
    the document)."""
    found: Dict[str, List[CollectiveEntry]] = {}
    fields = set(CollectiveEntry.model_fields)
    for row in frame_records(table):
        key = OP_KEYS.get(row["op"], row["op"])
        values = {k: v for k, v in _clean(row).items() if k in fields}
        found.setdefault(key, []).append(CollectiveEntry.model_validate(values))
    return found


def _memory(experiment: Experiment) -> List[MemoryEntry]:
    entries = []
    for record in experiment.records:
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


def _profiles(experiment: Experiment, source: Path) -> List[ProfileEntry]:
    table = profile_table(ReportData(source, [experiment]))
    fields = set(ProfileEntry.model_fields)
    return [
        ProfileEntry.model_validate({k: v for k, v in _clean(row).items() if k in fields})
        for row in frame_records(table)
    ]


def build_document(experiment: Experiment, source: Optional[Path] = None) -> BenchmarkDocument:
    """``source``: the folder the profiles' paths are relative to (the experiment's parent)."""
    data = ReportData(source or experiment.path.parent, [experiment])
    with words.ranks_on_cpu(data.on_cpu):
        return _document(experiment, data.source)


def _document(experiment: Experiment, source: Path) -> BenchmarkDocument:
    table = training_table(experiment.records)
    fields = set(TrainingEntry.model_fields)
    training = [
        TrainingEntry.model_validate({k: v for k, v in _clean(row).items() if k in fields})
        for row in frame_records(table)
    ]
    config = experiment.manifest.get("config") or {}
    named = (getattr(r, "device_name", None) for r in experiment.records)
    devices = [name for name in named if name]
    return BenchmarkDocument(
        name=experiment.name,
        world_size=max((r.world_size for r in experiment.records), default=0),
        timestamp=experiment.manifest.get("updated_at") or experiment.manifest.get("created_at"),
        config=RunConfig(
            warmup_iters=_first(config.get("warmup_steps")),
            benchmark_iters=_first(config.get("measure_steps")),
            device=devices[0] if devices else None,
            ranks=words.devices(),
            note=cpu_run_note() if words.on_cpu() else None,
            benchmark=config,
        ),
        results=Results.model_validate(
            {
                "training": training,
                "memory": _memory(experiment),
                **kind_document_results(experiment.records),
            }
        ),
        profiles=_profiles(experiment, source),
    )


def document_schema() -> Dict[str, object]:
    return BenchmarkDocument.model_json_schema()


def render_documents(data: ReportData) -> bytes:
    """The document of the one experiment, or a JSON array of them for a folder of several."""
    documents = [build_document(e, data.source).model_dump(mode="json") for e in data.experiments]
    body: Any = documents[0] if len(documents) == 1 else documents
    return (json.dumps(body, indent=2, allow_nan=False) + "\n").encode("utf-8")
