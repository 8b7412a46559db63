"""Records are checked when they are read: a figure that cannot be true makes its record invalid.

A throughput or a step time that is NaN, infinite, zero, negative or absurd (above
:data:`ABSURD`: 1e15 samples a second, or steps of 30,000 years) was not measured, whatever wrote
it (a damaged file, a hand edit, a bug); nor was a cell of 0 or -2 ranks, or a batch of 0, in
any status; a loss that is NaN or infinite on any rank (``last_loss``) is a model that diverged,
whose speed means nothing. Such a record keeps its place but gets status ``invalid`` and an
error naming the figure, so every table shows it as such and nothing that summarises or
compares results (which all take ``ok`` records only, tune's trials included) ever uses it. A
record with a ``schema_version`` this torchscale does not know is read, with a warning. A
record that does not validate against the schema is invalid too (kept as a record where what
identifies it validates).

Everything that reads ``results.jsonl`` goes through :func:`check_and_parse` (the sweep's
``--resume``, reports, ``compare``), and the sweep passes the records it makes through
:func:`checked_record` before writing them. What summarises or compares also goes through
:func:`latest_runs`: a cell recorded twice (a concatenated file, a re-run) counts once.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Dict, Iterable, List, Sequence, Set, Tuple

from pydantic import ValidationError

from torchscale.results.schema import SCHEMA_VERSION, ResultBase, parse_record

log = logging.getLogger("torchscale")

INVALID = "invalid"
KNOWN_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})
_STATS = ("mean", "p50", "p95", "p99", "min", "max")

# Per kind: figures that must be finite and > 0 where present, those that must be present in an
# ``ok`` record, and those that must be finite and >= 0 (a zero bandwidth is a zero-byte message).
POSITIVE = {
    "training": ("throughput", "samples_per_s", "measured_s"),
    "collective": ("time_us", "time_us_min", "time_us_max"),
    "tp_gemm": ("time_us", "comm_time_us", "gemm_time_us"),
}
PER_STEP = ("training",)
"""Record kinds with per-step times (``step_times_ms``, and each of ``per_rank``'s)."""
REQUIRED = {"training": ("throughput",), "collective": ("time_us",), "tp_gemm": ("time_us",)}
NON_NEGATIVE = {
    "training": ("tflops_per_gpu", "mfu"),
    "collective": ("algbw_gbps", "busbw_gbps"),
    "tp_gemm": ("tflops",),
}
COUNTS = {
    "*": ("world_size", "nnodes", "nproc_per_node"),
    "training": ("batch_size", "global_batch_size", "grad_accum_steps"),
}
"""Whole numbers every record (``*``, in any status: a cell of 0 ranks was never planned) or a
measured record of a kind (``ok``: a batch of -2 was never run) must have at 1 or more. A cell
that failed before it measured may not know its batch: a user's script counts its samples as it
runs (``--script``), so its failed record says 0."""
ABSURD = 1e15
"""Above this a measured figure cannot be true (no cell runs 1e15 samples a second, no step
takes 1e15 ms); 1e308 would also overflow every ratio taken of it."""
MAX_COUNT = 1 << 24
"""More ranks, nodes or samples per batch than any job has (16.7M)."""


def show(value: object) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value) if isinstance(value, str) else f"{value:g}" if _number(value) else str(value)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(name: str, value: Any, found: List[str], *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not _number(value):
        found.append(f"{name} is {show(value)}, not a number")
    elif not math.isfinite(value):
        found.append(f"{name} is {show(value)}")
    elif value < 0 or (value == 0 and not allow_zero):
        found.append(f"{name} is {show(value)} (must be {'>= 0' if allow_zero else '> 0'})")
    elif value > ABSURD:
        found.append(f"{name} is {show(value)} (absurd: above {ABSURD:g})")


def _check_count(name: str, value: Any, found: List[str]) -> None:
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        found.append(f"{name} is {show(value)} (must be a whole number from 1 to {MAX_COUNT:,})")


def _check_steps(prefix: str, doc: Dict[str, Any], found: List[str]) -> None:
    stats = doc.get("step_time_ms")
    if isinstance(stats, dict):
        for key in _STATS:
            _check(f"{prefix}step_time_ms.{key}", stats.get(key), found)
        for key in ("std", "cv"):
            _check(f"{prefix}step_time_ms.{key}", stats.get(key), found, allow_zero=True)
    steps = doc.get("step_times_ms")
    if isinstance(steps, list):
        bad = [i for i, v in enumerate(steps) if not (_number(v) and 0 < v <= ABSURD)]
        if bad:
            first = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            found.append(f"{prefix}step_times_ms[{first}] is {show(steps[first])}{more}")


def problems(doc: Dict[str, Any]) -> List[str]:
    """Why ``doc`` cannot be true, or nothing. Counts are checked in every status (only an
    ``invalid`` record is left as it is); figures only in measured (``ok``) records."""
    kind = doc.get("kind", "training")
    kind = kind if isinstance(kind, str) else ""  # a list is no kind (and no dict key)
    found: List[str] = []
    if doc.get("status", "ok") != INVALID:
        for name in COUNTS["*"]:
            _check_count(name, doc.get(name), found)
    if doc.get("status", "ok") != "ok":
        return found
    for name in COUNTS.get(kind, ()):
        _check_count(name, doc.get(name), found)
    for name in REQUIRED.get(kind, ()):
        if doc.get(name) is None:
            found.append(f"{name} is missing")
    for name in POSITIVE.get(kind, ()):
        _check(name, doc.get(name), found)
    for name in NON_NEGATIVE.get(kind, ()):
        _check(name, doc.get(name), found, allow_zero=True)
    if kind in PER_STEP:
        _check_steps("", doc, found)
        ranks = doc.get("per_rank")
        for rank in ranks if isinstance(ranks, list) else []:
            if isinstance(rank, dict):
                _check_steps(f"rank {rank.get('rank')} ", rank, found)
        _check_loss(doc, found)
        _check_gradients(doc, found)
    return found


def _check_gradients(doc: Dict[str, Any], found: List[str]) -> None:
    """A failed gradient check (``gradient_check.passed`` false): its cause, one reason."""
    check = doc.get("gradient_check")
    if isinstance(check, dict) and check.get("passed") is False:
        found.append(f"gradient check failed: {check.get('cause') or 'no cause recorded'}")


def _not_finite(value: Any) -> bool:
    """A loss that is there and is not a finite number (``"NaN"`` as a worker writes it, too)."""
    if value is None or isinstance(value, bool):
        return value is not None
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _loss_text(value: Any) -> str:
    try:
        return show(float(value))
    except (TypeError, ValueError):
        return show(value)


def _check_loss(doc: Dict[str, Any], found: List[str]) -> None:
    """A diverged loss (any sign is a loss; NaN or infinite is not): one reason for the record."""
    listed = doc.get("per_rank")
    ranks = [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []
    bad = [
        f"rank {r.get('rank')} {_loss_text(r.get('last_loss'))}"
        for r in ranks
        if _not_finite(r.get("last_loss"))
    ]
    if not bad and _not_finite(doc.get("last_loss")):
        bad = [_loss_text(doc.get("last_loss"))]
    if bad:
        found.append(f"the loss diverged (last loss: {', '.join(bad)})")


def _invalid(doc: Dict[str, Any], reasons: List[str]) -> Dict[str, Any]:
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    recorded = doc.get("status", "ok")
    return {
        **doc,
        "status": INVALID,
        "recorded_status": recorded,
        "error": f"invalid record (recorded as {recorded}): {shown}",
    }


def check_and_parse(
    documents: Iterable[Any], source: Any
) -> Tuple[List[Dict[str, Any]], List[ResultBase]]:
    """Every object of a ``results.jsonl`` (impossible figures marked invalid) and its record:
    a kind this torchscale does not know is read as the fields every record has (``ResultBase``).
    ``source`` names the file in warnings (one per kind of problem and file). A record that does
    not validate is marked invalid too, and kept as a record with what identifies it where that
    much validates."""
    out: List[Dict[str, Any]] = []
    records: List[ResultBase] = []
    invalid: List[str] = []
    versions = set()
    for doc in documents:
        if not isinstance(doc, dict):
            log.warning("%s: skipped a line that is not a JSON object", source)
            continue
        version = doc.get("schema_version", SCHEMA_VERSION)
        if not isinstance(version, int) or version not in KNOWN_SCHEMA_VERSIONS:
            versions.add(str(version))
        original = doc
        reasons = problems(doc)
        if reasons:
            doc = _invalid(original, reasons)
            invalid.append(f"{doc.get('cell_id')}: {reasons[0]}")
        try:
            records.append(parse_record(doc))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error.get("loc", ()))
            reason = f"does not validate ({where}: {error.get('msg')})"
            if not reasons:
                invalid.append(f"{doc.get('cell_id')}: {reason}")
            doc = _invalid(original, [*reasons, reason])
            # Keep what identifies it, so that tables can show it as invalid.
            with contextlib.suppress(ValidationError):
                records.append(parse_record(_identity_only(doc)))
        out.append(doc)
    if versions:
        log.warning(
            "%s: record(s) with schema_version %s, which this torchscale (schema_version %d) "
            "does not know; read as version %d, fields may be misread: upgrade torchscale",
            source,
            ", ".join(sorted(versions)),
            SCHEMA_VERSION,
            SCHEMA_VERSION,
        )
    if invalid:
        more = f" (and {len(invalid) - 1} more)" if len(invalid) > 1 else ""
        log.warning(
            "%s: %d invalid record(s), shown as invalid and never compared: %s%s",
            source,
            len(invalid),
            invalid[0],
            more,
        )
    return out, records


def _identity_only(doc: Dict[str, Any]) -> Dict[str, Any]:
    keep = set(ResultBase.model_fields) | {"model", "batch_size", "global_batch_size", "precision"}
    keep |= {"dtype", "op", "m", "n", "k", "order"}
    return {key: value for key, value in doc.items() if key in keep}


def checked_record(record: ResultBase) -> ResultBase:
    """``record`` as it will be read back: invalid when a figure cannot be true."""
    doc = record.model_dump(mode="python")
    reasons = problems(doc)
    if not reasons:
        return record
    changed = _invalid(doc, reasons)
    return record.model_copy(update={"status": INVALID, "error": changed["error"]})


def _run_mark(record: ResultBase) -> Tuple[Any, Any]:
    return record.started_at, record.finished_at


def _figures_key(record: ResultBase) -> str:
    """The record's scalar fields: equal for a line written twice, different for two records
    of one run (a collective's sizes)."""
    return repr(sorted((k, v) for k, v in vars(record).items() if not isinstance(v, (list, dict))))


def latest_runs(records: Sequence[ResultBase], source: Any) -> List[ResultBase]:
    """The records of each cell's last run, in file order: one cell counted once however often
    it was recorded (a results file concatenated, a cell re-run with ``--retry-failed`` or
    ``--resume --force``). A run is the block of records a cell's end appended at once: a new
    one starts where the cell's records are not adjacent, their start and end times change, or
    a record repeats one of the block. Said in one log line naming ``source`` (a warning unless
    every earlier run had failed: a retry); nothing is said when ``source`` is None."""
    blocks: Dict[str, List[List[int]]] = {}
    keys: Dict[str, Set[str]] = {}
    previous: Dict[str, int] = {}
    for index, record in enumerate(records):
        cell = record.cell_id
        key = _figures_key(record)
        runs = blocks.setdefault(cell, [])
        if (
            not runs
            or previous[cell] != index - 1
            or _run_mark(records[runs[-1][-1]]) != _run_mark(record)
            or key in keys[cell]
        ):
            runs.append([])
            keys[cell] = set()
        runs[-1].append(index)
        keys[cell].add(key)
        previous[cell] = index
    repeated = {cell: runs for cell, runs in blocks.items() if len(runs) > 1}
    if not repeated:
        return list(records)
    kept = sorted(index for runs in blocks.values() for index in runs[-1])
    if source is None:
        return [records[index] for index in kept]
    retried = all(
        records[i].status != "ok" for runs in repeated.values() for run in runs[:-1] for i in run
    )
    names = sorted(repeated)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    (log.info if retried else log.warning)(
        "%s: %d cell(s) recorded more than once (%s): each counted once, its last run used (a "
        "results file concatenated, or cells re-run with --retry-failed or --resume --force)",
        source,
        len(names),
        shown,
    )
    return [records[index] for index in kept]
