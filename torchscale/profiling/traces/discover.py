"""Find per-rank trace files under the paths a user gives, and load them."""

from __future__ import annotations

import gzip
import os
import re
import sqlite3
import stat
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from torchscale.errors import TorchscaleError
from torchscale.profiling.traces.model import RankTrace, describe_invalid
from torchscale.results.files import not_regular
from torchscale.results.layout import FINDINGS_FILE

KINETO_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite",)
# Our own outputs live beside the traces; never read them back as traces.
OWN_OUTPUTS = frozenset({FINDINGS_FILE})
# Where a trace's rank number came from (the ``rank_source`` of the JSON and of the tables).
RANK_SOURCES = {
    "trace": "the trace's own distributedInfo",
    "nvtx": "NVTX rank marks (torchrun's RANK)",
    "device": "CUDA device ids (one process per GPU)",
    "file name": "file names (rank<N>)",
    "order": "file order (nothing recorded the rank)",
}
_RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)


def trace_format(path: Path) -> Optional[str]:
    name = path.name.lower()
    if name in OWN_OUTPUTS:
        return None
    if name.endswith(KINETO_SUFFIXES):
        return "kineto"
    if name.endswith(NSYS_SUFFIXES):
        return "nsys"
    return None


SNIFF_BYTES = 1 << 20  # Kineto writes "traceEvents" after a few KB of device properties


def looks_like_trace(path: Path) -> bool:
    """For files found in a folder: is this a trace, or another JSON/SQLite file (a benchmark's
    result.json, cell.json, ...) that happens to sit beside the traces?"""
    try:
        if trace_format(path) == "nsys":
            with open(path, "rb") as fh:
                return fh.read(16) == b"SQLite format 3\x00"
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            return b'"traceEvents"' in fh.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return True  # let the reader report what is wrong with it


def find_trace_files(paths: Sequence[Path]) -> List[Path]:
    """Trace files named by ``paths`` (files, or folders searched one level down)."""
    found: List[Path] = []
    for path in paths:
        if not path.exists():
            raise TorchscaleError(
                f"{path}: no such file or folder; pass trace files or a folder holding them"
            )
        mode = os.stat(path).st_mode  # a link is followed: to a regular file, it is fine
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            # A FIFO would block the reader forever, /dev/zero would feed it without end.
            raise not_regular(path, mode, "read traces from")
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and trace_format(p))
            inside += sorted(
                p
                for sub in sorted(path.iterdir())
                if sub.is_dir()
                for p in sub.iterdir()
                if p.is_file() and trace_format(p)
            )
            found += [p for p in inside if looks_like_trace(p)]
        elif trace_format(path):
            found.append(path)
        else:
            raise TorchscaleError(
                f"{path}: not a trace (expected .json, .json.gz from "
                "torch.profiler or .sqlite from 'nsys export --type sqlite')"
            )
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        shown = ", ".join(str(p) for p in paths)
        raise TorchscaleError(
            f"no traces found in {shown}; expected per-rank .json/.json.gz "
            "(torch.profiler) or .sqlite (nsys export) files"
        )
    return unique


def rank_from_name(path: Path) -> Optional[int]:
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def load_traces(
    paths: Sequence[Path],
    workers: Optional[int] = None,
    warnings: Optional[List[str]] = None,
    max_memory: Optional[int] = None,
    trim_last_step: bool = True,
) -> List[RankTrace]:
    """Read every trace under ``paths``; ranks come from the trace, its file name, or its order.

    Traces of another job found beside the analysed one are left out, with a line appended to
    ``warnings`` naming them (see :func:`split_jobs`); so are invalid events (a line per trace).
    A trace without a valid event is refused (:func:`check_not_empty`). ``max_memory``: the
    budget in bytes (default: the memory available), see ``memory_budget``. ``trim_last_step``:
    HTA's rule of leaving out the last, cut-short ProfilerStep (``kineto.finish``)."""
    from torchscale.profiling.traces.kineto import TraceReadError, read_kineto_files
    from torchscale.profiling.traces.kineto_decode import DecodeError
    from torchscale.profiling.traces.memory_budget import MemoryBudget
    from torchscale.profiling.traces.nsys_sqlite import NoGpuActivity, read_nsys

    files = find_trace_files(paths)
    budget = MemoryBudget.start(max_memory)
    kineto = [f for f in files if trace_format(f) == "kineto"]
    traces: Dict[Path, List[RankTrace]] = {}
    if kineto:
        try:
            read = read_kineto_files(kineto, workers, budget, trim_last_step)
            traces.update({p: [t] for p, t in read.items()})
        except (OSError, EOFError, zlib.error, *DecodeError) as exc:
            raise TraceReadError(f"cannot read trace: {exc}") from None  # raised outside a file
    for path in files:
        if trace_format(path) == "nsys":
            try:
                traces[path] = read_nsys(path, budget)
            except NoGpuActivity as exc:
                raise TraceReadError(str(exc)) from None
            except sqlite3.DatabaseError as exc:
                raise TraceReadError(f"{path}: not a readable nsys SQLite export ({exc})") from None
    ordered = [trace for f in files for trace in traces[f]]
    for trace in ordered:
        check_not_empty(trace)
    for position, trace in enumerate(ordered):
        if trace.rank < 0:
            from_name = rank_from_name(trace.path)
            trace.rank = position if from_name is None else from_name
            trace.metadata["rank_source"] = "order" if from_name is None else "file name"
        trace.metadata.setdefault("rank_source", "trace")
    kept, mixed = split_jobs(ordered)
    if warnings is not None:
        warnings += mixed
        warnings += [
            f"rank {t.rank} ({t.path.name}): {describe_invalid(t.invalid)} left out of every figure"
            for t in sorted(kept, key=lambda t: t.rank)
            if t.invalid
        ]
    check_unique_ranks(kept)
    return sorted(kept, key=lambda t: t.rank)


def check_not_empty(trace: RankTrace) -> None:
    """No analysis passes on nothing: a trace without a valid event is refused, saying why."""
    if trace.event_count:
        return
    where = trace.path.name if trace.source == "kineto" else f"{trace.path.name} (one rank)"
    if trace.invalid:
        raise TorchscaleError(
            f"{where}: no valid events, {describe_invalid(trace.invalid)}; nothing to "
            "analyse: is it a complete, undamaged trace?"
        )
    raise TorchscaleError(
        f"{where}: the trace holds no events to analyse (no kernels, copies, operators or "
        "ranges); capture again with the profiler active for some steps"
    )


def check_unique_ranks(traces: Sequence[RankTrace]) -> None:
    """One trace per rank within one job: two claiming a rank are two captures mixed up."""
    used: Dict[int, RankTrace] = {}
    for trace in traces:
        if trace.rank in used:
            where = trace.path.name
            if used[trace.rank].path == trace.path:
                where += f", devices {used[trace.rank].metadata.get('device')} and " + str(
                    trace.metadata.get("device")
                )
            hint = "pass one trace per rank (one capture at a time)"
            if trace.metadata.get("rank_source") == "device":
                hint = (
                    "ranks taken from CUDA device ids repeat across files (one export per "
                    "node?): analyse each node's export on its own, or capture with torchscale, "
                    "whose NVTX rank marks number the ranks of every node"
                )
            raise TorchscaleError(f"two traces claim rank {trace.rank} ({where}); {hint}")
        used[trace.rank] = trace


def job_of(trace: RankTrace) -> Optional[Tuple[str, int]]:
    """What a trace says about the job it came from: (backend, world size), None if it says
    nothing (then it can belong to any job)."""
    info = trace.metadata.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("world_size"), int):
        return (str(info.get("backend") or ""), int(info["world_size"]))
    world = trace.metadata.get("world_size")
    return ("", int(world)) if isinstance(world, int) else None


def split_jobs(traces: Sequence[RankTrace]) -> Tuple[List[RankTrace], List[str]]:
    """The traces of one job, and a warning for each other job found beside them.

    Traces that declare different jobs (world size, backend) are never matched against each
    other: the job with the most traces is analysed (traces declaring nothing join it).
    """
    jobs: Dict[Tuple[str, int], List[RankTrace]] = {}
    for trace in traces:
        job = job_of(trace)
        if job is not None:
            jobs.setdefault(job, []).append(trace)
    if len(jobs) < 2:
        return list(traces), []
    kept = max(jobs, key=lambda job: len(jobs[job]))
    warnings = []
    for job, members in jobs.items():
        if job == kept:
            continue
        names = ", ".join(sorted({t.path.name for t in members}))
        warnings.append(
            f"{names}: from another job (world size {job[1]}"
            + (f", {job[0]}" if job[0] else "")
            + f"; analysed: world size {kept[1]}); left out, analyse them on their own"
        )
    return [t for t in traces if job_of(t) in (None, kept)], warnings
