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

from torchscale.errors import TorchscaleError
from torchscale.history.database import HistoryError, PointEntry, RunEntry, SeriesEntry
from torchscale.results.layout import (
    CELLS,
    FINDINGS_FILE,
    FLEET_REPORT,
    MANIFEST,
    RESULTS,
    VALIDATE_DIR,
    VALIDATE_RECORD_GLOB,
    is_profile_run,
)
from torchscale.results.schema import ResultBase

METRICS = ("throughput", "p95", "busbw", "efficiency")
"""The figures a benchmark cell's point can hold: throughput (training, in the record's unit per
second), p95 step time (ms), busbw (GB/s, a collective), and scaling efficiency (a fraction of
linear, the report's figure: a training cell against the smallest rank count of its
configuration in the same run; none where the run measured one rank count only)."""
PROFILE_METRICS = {"sync_stall": "sync_stall_pct"}
"""A profiled cell's figures from its findings file: the metric -> the document's key
(sync stall time, % of the traced step, the mean over ranks)."""
VALIDATE_KIND = "validate"
"""The series kind of validate's figures: one series per node and device, its probe the metric
(``gemm_bf16``, ``memory_copy``, ... as ``hardware.expected_figures.PROBES`` names them)."""
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


def _efficiencies(records: List[ResultBase]) -> List[Tuple[ResultBase, float]]:
    """Each training cell's scaling efficiency, as the report computes it
    (``analysis.training_tables``); none for a run that measured one rank count."""
    from torchscale.results.schema import TrainingResult

    training = [r for r in records if isinstance(r, TrainingResult)]
    if len({(r.world_size, r.nnodes) for r in training if r.status == "ok"}) < 2:
        return []
    from torchscale.analysis.training_tables import training_table

    table = training_table(training)
    found: List[Tuple[ResultBase, float]] = []
    for record, value in zip(training, table["scaling_efficiency"].tolist()):
        if record.status == "ok" and isinstance(value, float) and math.isfinite(value):
            found.append((record, value))
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
    for record, value in _efficiencies(records):
        entry = _series(record, environment)
        entries[entry.key] = entry
        grouped[(entry.key, "efficiency")].append((value, None))
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
        "`torchscale benchmark`, `profile` or `validate --level 2` wrote"
    )


def _profile_points(
    folder: Path, records: List[ResultBase], environment: Dict[str, Any]
) -> List[PointEntry]:
    """The profiled cells' figures (``cells/<cell>/<profile dir>/findings.json``), one point per
    cell and figure, in the cell's own series. A findings file that does not parse refuses the
    run: it is part of what the run measured."""
    from torchscale.results.json_input import read_object

    found = []
    for record in records:
        profile = getattr(record, "profile", None)
        if record.status != "ok" or profile is None or not profile.profiled:
            continue
        path = folder / CELLS / record.cell_id / (profile.dir or "") / FINDINGS_FILE
        if not path.is_file() or path.is_symlink():
            continue
        try:
            document = read_object(path, "findings file")
        except (OSError, TorchscaleError) as exc:
            raise _refuse(folder, str(exc).splitlines()[0]) from None
        entry = _series(record, environment)
        for metric, key in PROFILE_METRICS.items():
            value = document.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
                found.append(PointEntry(entry, metric, float(value), None, 1))
    return found


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
    profiled = _profile_points(folder, records, environment)
    return RunEntry(
        identity=identity,
        experiment=experiment,
        kind="profile" if profiled or is_profile_run(experiment) else "benchmark",
        started_at=started,
        hardware=hardware,
        attributes=attributes,
        source=str(folder.absolute()),
        points=_points(records, environment) + profiled,
    )


def validate_folder(folder: Path) -> Optional[Path]:
    """``folder``'s validate records folder: the folder itself (``.../validate``) or its
    ``validate/``; None when it has none."""
    for candidate in (folder, folder / VALIDATE_DIR):
        if candidate.name != VALIDATE_DIR or not candidate.is_dir() or candidate.is_symlink():
            continue
        if any(candidate.glob(VALIDATE_RECORD_GLOB)) or (candidate / FLEET_REPORT).is_file():
            return candidate
    return None


def _validate_run(report: Any, source: Path) -> Optional[RunEntry]:
    """One host's validate report (level 2+) as a run: a point per device and probe."""
    if not isinstance(report, dict):
        return None
    host, time, probes = report.get("host"), report.get("time"), report.get("probes")
    if not isinstance(host, str) or not isinstance(time, str) or not isinstance(probes, list):
        return None
    names = sorted({str(p.get("device_name")) for p in probes if isinstance(p, dict)} - {"None"})
    hardware = f"{'+'.join(names) or 'unknown device'} on {host}"
    found: Dict[Tuple[str, str], PointEntry] = {}  # a figure listed twice: the later one
    for figure in probes:
        if not isinstance(figure, dict):
            continue
        probe, device, value = figure.get("probe"), figure.get("device"), figure.get("value")
        if not isinstance(probe, str) or not isinstance(device, str):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        samples = [v for v in figure.get("samples") or [] if isinstance(v, (int, float))]
        mean = sum(samples) / len(samples) if samples else 0.0
        spread = None
        if len(samples) > 1 and mean > 0:
            var = sum((v - mean) ** 2 for v in samples) / (len(samples) - 1)
            spread = math.sqrt(var) / mean
        # the device's own name is its hardware: a probe missing one night moves no series
        sku = str(figure.get("device_name") or "unknown device")
        series = SeriesEntry(
            key=digest([VALIDATE_KIND, host, device, sku], 32),
            kind=VALIDATE_KIND,
            name=f"{host} {device}",
            batch=None,
            gpus=1,
            nnodes=1,
            precision="",
            digest=digest(device, 8),
            hardware=f"{sku} on {host}",
        )
        point = PointEntry(series, probe, float(value), spread, max(len(samples), 1))
        found[(series.key, probe)] = point
    if not found:
        return None
    attributes: Dict[str, Any] = {"torchscale": report.get("torchscale"), "hosts": [host]}
    attributes["level"] = report.get("level")
    return RunEntry(
        identity=digest([VALIDATE_KIND, host, time], 64),
        experiment=VALIDATE_KIND,
        kind=VALIDATE_KIND,
        started_at=time,
        hardware=hardware,
        attributes=attributes,
        source=str(source.absolute()),
        points=list(found.values()),
    )


def read_validate(folder: Path) -> List[RunEntry]:
    """validate's records in ``folder`` (``host-<host>.json`` per node, ``fleet.json``'s every
    node): one run per host and time, so a node's own record and the fleet report that holds it
    too are one run. A record that does not parse refuses the folder (one line)."""
    from torchscale.results.json_input import read_object

    runs: Dict[str, RunEntry] = {}
    paths = sorted(folder.glob(VALIDATE_RECORD_GLOB))
    fleet = folder / FLEET_REPORT
    for path in [*paths, *([fleet] if fleet.is_file() else [])]:
        if path.is_symlink():
            raise _refuse(folder, f"{path.name} is a symbolic link")
        try:
            document = read_object(path, "validate record")
        except (OSError, TorchscaleError) as exc:
            raise _refuse(folder, f"{path.name}: {str(exc).splitlines()[0]}") from None
        reports = document.get("reports") if path == fleet else [document]
        for report in reports if isinstance(reports, list) else []:
            run = _validate_run(report, path)
            if run is not None:
                runs.setdefault(run.identity, run)
    if not runs:
        raise _refuse(folder, "no validate record with probe figures")
    return sorted(runs.values(), key=lambda run: (run.started_at, run.identity))
