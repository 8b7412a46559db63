"""An experiment folder as one run of the history: its identity, hardware, attributes and points.

A series is a cell's identity (kind, model or script or collective and size, batch, GPU count,
nodes, precision, settings digest) on one hardware fingerprint (device SKU and count per node,
node count). Software versions and host names are the run's attributes: what a change point
names as its cause. The whole folder is read and checked before anything is stored, so a
damaged or foreign folder is refused with one line and nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from torchscale.history.database import HistoryError, PointEntry, RunEntry, SeriesEntry
from torchscale.results.layout import MANIFEST, RESULTS
from torchscale.results.schema import ResultBase

METRICS = ("throughput", "p95", "busbw")
"""The figures a point can hold: throughput (training, in the record's unit per second), p95
step time (ms), busbw (GB/s, a collective). Efficiency is derived at read time."""
SOFTWARE = ("torch", "cuda", "nccl", "driver", "torchscale", "python")
"""The versions a run carries as attributes (the manifest's environment)."""
_SETTINGS_LEFT_OUT = ("repeat", "gpus", "nnodes", "cell_timeout_s", "stall_timeout_s")
"""Cell settings that do not make another series: the repeat, and the placement and time limits
already in the key or irrelevant to speed."""


def digest(document: Any, length: int = 16) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def hardware_fingerprint(environment: Dict[str, Any], per_node: int, nnodes: int) -> str:
    """``"<SKU> x<per node> x<nodes> nodes"``: the SKU is the GPUs' name, or the CPU's on a node
    without GPUs (every rank a CPU process)."""
    gpus = environment.get("gpus") or []
    names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")})
    cpu = environment.get("cpu") or "unknown CPU"
    sku = "+".join(names) if names else f"CPU process ({cpu})"
    return f"{sku} x{per_node} x{nnodes} nodes"


def _figures(record: ResultBase) -> Dict[str, float]:
    found: Dict[str, float] = {}
    throughput = getattr(record, "throughput", None)
    step = getattr(record, "step_time_ms", None)
    busbw = getattr(record, "busbw_gbps", None)
    if isinstance(throughput, (int, float)) and math.isfinite(throughput) and throughput > 0:
        found["throughput"] = float(throughput)
    p95 = getattr(step, "p95", None)
    if isinstance(p95, (int, float)) and math.isfinite(p95) and p95 > 0:
        found["p95"] = float(p95)
    if isinstance(busbw, (int, float)) and math.isfinite(busbw) and busbw > 0:
        found["busbw"] = float(busbw)
    return found


def _series(record: ResultBase, environment: Dict[str, Any]) -> SeriesEntry:
    settings = {k: v for k, v in record.settings.items() if k not in _SETTINGS_LEFT_OUT}
    op = getattr(record, "op", None)
    if op is not None:
        size = getattr(record, "size_bytes", None) or getattr(record, "requested_bytes", None)
        name = f"{op} {getattr(record, 'scope', 'world')} {size or '?'} B"
    else:
        name = str(
            getattr(record, "model", None) or settings.get("script") or settings.get("model") or "?"
        )
    batch = getattr(record, "batch_size", None)
    precision = str(getattr(record, "precision", None) or getattr(record, "dtype", None) or "")
    hardware = hardware_fingerprint(environment, record.nproc_per_node, record.nnodes)
    cell_digest = digest(settings, 8)
    identity = [record.kind, name, batch, record.world_size, record.nnodes, precision]
    return SeriesEntry(
        key=digest([*identity, cell_digest, hardware], 32),
        kind=record.kind,
        name=name,
        batch=int(batch) if isinstance(batch, int) else None,
        gpus=record.world_size,
        nnodes=record.nnodes,
        precision=precision,
        digest=cell_digest,
        hardware=hardware,
    )


def _points(records: List[ResultBase], environment: Dict[str, Any]) -> List[PointEntry]:
    """One point per series and metric: the mean over the run's repeats of the cell, the spread
    the step-time CV (root mean square over the repeats)."""
    grouped: Dict[Tuple[str, str], List[Tuple[float, Optional[float]]]] = defaultdict(list)
    entries: Dict[str, SeriesEntry] = {}
    for record in records:
        if record.status != "ok":
            continue
        entry = _series(record, environment)
        entries[entry.key] = entry
        step = getattr(record, "step_time_ms", None)
        cv = getattr(step, "cv", None)
        for metric, value in _figures(record).items():
            grouped[(entry.key, metric)].append((value, cv if isinstance(cv, float) else None))
    found = []
    for (key, metric), values in sorted(grouped.items()):
        cvs = [cv for _, cv in values if cv is not None and math.isfinite(cv)]
        spread = math.sqrt(sum(cv * cv for cv in cvs) / len(cvs)) if cvs else None
        mean = sum(v for v, _ in values) / len(values)
        found.append(PointEntry(entries[key], metric, mean, spread, len(values)))
    return found


def _refuse(folder: Path, why: str) -> HistoryError:
    return HistoryError(
        f"{folder} is not a torchscale experiment folder ({why}); give a folder that "
        "`torchscale benchmark` wrote"
    )


def read_run(folder: Path) -> RunEntry:
    """The run in ``folder``, read whole and checked; a damaged or foreign folder is a
    :class:`HistoryError` naming what is wrong."""
    from torchscale.results.json_input import DamagedJson, jsonl_documents
    from torchscale.results.store import ExperimentStore

    folder = Path(folder)
    if folder.is_symlink():
        raise _refuse(folder, "a symbolic link")
    if not (folder / MANIFEST).is_file() or (folder / MANIFEST).is_symlink():
        raise _refuse(folder, f"no {MANIFEST}")
    if not (folder / RESULTS).is_file() or (folder / RESULTS).is_symlink():
        raise _refuse(folder, f"no {RESULTS}")
    store = ExperimentStore(folder)
    try:
        manifest = store.manifest()
        lines = sum(1 for _ in jsonl_documents(folder / RESULTS))
    except DamagedJson as exc:
        raise _refuse(folder, str(exc).splitlines()[0]) from None
    experiment = manifest.get("experiment")
    created = manifest.get("created_at")
    environment = manifest.get("environment")
    if not isinstance(experiment, str) or not isinstance(created, str):
        raise _refuse(folder, f"{MANIFEST} lacks its experiment name or creation date")
    if not isinstance(environment, dict):
        raise _refuse(folder, f"{MANIFEST} lacks the environment")
    raw_lines = [line for line in (folder / RESULTS).read_bytes().splitlines() if line.strip()]
    records = store.records()
    if len(raw_lines) != lines or len(records) != len(raw_lines):
        bad = len(raw_lines) - len(records)
        raise _refuse(folder, f"{RESULTS} has {bad} damaged or impossible record(s)")
    if not records:
        raise _refuse(folder, f"{RESULTS} holds no record")
    hosts = sorted({host for record in records for host in record.hosts})
    attributes: Dict[str, Any] = {name: environment.get(name) for name in SOFTWARE}
    attributes["hosts"] = hosts
    started = min((r.started_at for r in records if r.started_at), default=created)
    first = records[0]
    hardware = hardware_fingerprint(environment, first.nproc_per_node, first.nnodes)
    identity = digest([experiment, created, environment.get("host")], 64)
    return RunEntry(
        identity=identity,
        experiment=experiment,
        kind="benchmark",
        started_at=started,
        hardware=hardware,
        attributes=attributes,
        source=str(folder.absolute()),
        points=_points(records, environment),
    )
