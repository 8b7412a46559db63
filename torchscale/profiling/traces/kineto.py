"""Read PyTorch profiler (Kineto / Chrome trace) files, ``.json`` or ``.json.gz``, by streaming.

The file is never loaded whole. It is read in blocks; each block is cut at the last event
boundary (a ``}`` then ``,`` then ``{``; the cut is proven by the block decoding as a JSON array)
and decoded into columns (``kineto_decode``). Large plain files are split into byte ranges that
several processes decode at once; gzip input is decompressed by a helper thread (zlib releases
the GIL) while the main thread decodes.

After decoding, ``kineto_rows`` puts the events in the shape HTA gives them, so figures agree
with HTA: events without a category and the profiler's own "Trace" span are dropped; timestamps
with a fractional part are rounded as HTA does (start up, end down); and when there are at least
two ``ProfilerStep#N`` ranges, everything launched at or after the start of the last one is
dropped. Complete events without a finite start or duration, or with a negative one, are invalid:
HTA drops them silently, we count them (``RankTrace.invalid``) and the analysis reports them. A
trace left with no event is refused (``discover.check_not_empty``).

Memory: columns are held compact from the first block (``model``), joined one column at a time,
and checked against the analysis's memory budget after every block (``memory_budget``).
"""

from __future__ import annotations

import gzip
import io
import os
import queue
import re
import threading
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from torchscale.errors import TorchscaleError
from torchscale.profiling.traces import kineto_decode as dec
from torchscale.profiling.traces.kineto_rows import finish
from torchscale.profiling.traces.memory_budget import MemoryBudget
from torchscale.profiling.traces.model import RankTrace

BLOCK_BYTES = 8 << 20  # decode unit: big enough to amortise calls, small enough for the cache
HEAD_LIMIT_BYTES = 64 << 20  # "traceEvents" must start within this (Kineto writes it first)
MAX_EVENT_BYTES = 64 << 20
"""The largest single event read (real ones are a few KB): past it, no event boundary was found
and the trace is refused, so memory stays bounded on any input, an unterminated event included."""
PARALLEL_MIN_BYTES = 96 << 20  # below this a process pool costs more than it saves
MAX_WORKERS = 4
_TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,(?=\s*\{)")  # end of an event, its comma, the next event


class TraceReadError(TorchscaleError):
    """A trace file that cannot be read as what its name says it is."""


def _open(path: Path) -> io.BufferedIOBase:
    """The trace's bytes (decompressed); only a regular file is opened (a FIFO would block)."""
    from torchscale.results.files import open_for_read

    handle = open(open_for_read(path), "rb")  # noqa: SIM115 (returned, closed by the caller)
    if not path.name.endswith(".gz"):
        return handle
    unzipped = gzip.GzipFile(fileobj=handle, mode="rb")
    # typeshed says FileIO; gzip.open(path) stores its open() (a BufferedReader) here too
    unzipped.myfileobj = handle  # type: ignore[assignment]  # closed with it, as gzip.open would
    return unzipped


def _blocks(fh: io.BufferedIOBase, limit: Optional[int]) -> Iterator[bytes]:
    """Successive blocks of ``fh`` (at most ``limit`` bytes in all), read one block ahead by a
    thread so that gzip decompression overlaps decoding."""
    pending: queue.Queue[Any] = queue.Queue(maxsize=2)

    def produce() -> None:
        try:
            left = limit
            while left is None or left > 0:
                data = fh.read(BLOCK_BYTES if left is None else min(BLOCK_BYTES, left))
                if not data:
                    break
                if left is not None:
                    left -= len(data)
                pending.put(data)
            pending.put(b"")
        except BaseException as exc:  # re-raised in the reading thread below
            pending.put(exc)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    while True:
        item = pending.get()
        if isinstance(item, BaseException):
            raise item
        if not item:
            break
        yield item
    worker.join()


def _decode_until_boundary(buf: bytearray, out: dec.Columns) -> None:
    """Decode the complete events at the front of ``buf`` (``buf[0]`` is a ``[`` slot) and drop
    them, keeping the unfinished tail."""
    window = max(1, len(buf) - (1 << 20))
    for match in reversed(list(_BOUNDARY.finditer(buf, window))):
        comma = match.end() - 1
        buf[comma] = ord("]")
        try:
            with memoryview(buf) as view:
                dec.decode_event_list(view[: comma + 1], out)
        except dec.DecodeError:
            buf[comma] = ord(",")
            continue
        del buf[1 : comma + 1]
        return


def scan_range(
    path: Path,
    start: int,
    end: Optional[int],
    first: bool,
    last: bool,
    budget: Optional[MemoryBudget] = None,
    share: float = 1.0,
) -> dec.Columns:
    """Decode the events in bytes ``[start, end)`` of ``path``.

    ``first``: the range starts at the file start (metadata, then ``"traceEvents": [``).
    ``last``: the range runs to the end of the file (closing ``]`` and trailing metadata).
    Otherwise the range holds whole events separated by commas. ``budget``: refuse once what is
    held projects past it; ``share``: this range's share of everything read (a split file's
    parts are held together in the end).
    """
    out = dec.Columns()
    buf = bytearray(b"[")
    size = path.stat().st_size if end is None else end - start

    def check() -> None:
        if budget is not None:
            raw = getattr(fh, "myfileobj", None) or fh
            done = (raw.tell() - start) / size if size and share == 1 else None
            budget.check(int(out.nbytes / share), path, out.events, done)

    with _open(path) as fh:
        if start:
            fh.seek(start)
        limit = None if end is None else end - start
        blocks = _blocks(fh, limit)
        if first:
            head = bytearray()
            for block in blocks:
                head += block
                match = _TRACE_EVENTS.search(head)
                if match or len(head) > HEAD_LIMIT_BYTES:
                    break
            else:
                match = _TRACE_EVENTS.search(head)
            if not match:
                raise TraceReadError(
                    f'{path}: no "traceEvents" array, so not a PyTorch '
                    "profiler trace; pass Kineto .json/.json.gz or nsys .sqlite"
                )
            dec.decode_trace_object(bytes(head[: match.start()]) + b'"traceEvents": []}', out)
            buf += head[match.end() :]
        for block in blocks:
            buf += block
            if len(buf) > BLOCK_BYTES:
                _decode_until_boundary(buf, out)
                check()
                if len(buf) > BLOCK_BYTES + MAX_EVENT_BYTES:
                    raise TraceReadError(
                        f"{path}: no complete event in {len(buf) >> 20} MiB (an unterminated "
                        f"or damaged event; events over {MAX_EVENT_BYTES >> 20} MiB are "
                        "refused); is it a complete torch.profiler trace?"
                    )
    if last:
        dec.decode_trace_object(b'{"traceEvents": ' + bytes(buf), out)
    elif len(buf) > 1 and bytes(buf[1:]).strip():
        buf += b"]"
        dec.decode_event_list(bytes(buf), out)
    if budget is not None:
        budget.check(int(out.nbytes / share), path, out.events)
    return out


def _split_ranges(path: Path, parts: int) -> List[Tuple[int, Optional[int], bool, bool]]:
    """Byte ranges of a plain file, each cut just after a proven event boundary."""
    size = path.stat().st_size
    cuts: List[int] = []
    with open(path, "rb") as fh:
        for i in range(1, parts):
            fh.seek(size * i // parts)
            window = fh.read(2 << 20)
            matches = list(_BOUNDARY.finditer(window))
            for here, after in zip(matches, matches[1:]):
                piece = b"[" + window[here.end() : after.end() - 1] + b"]"
                try:
                    probe = dec.Columns()
                    dec.decode_event_list(piece, probe)
                except dec.DecodeError:
                    continue
                cut = size * i // parts + here.end()
                if not cuts or cut > cuts[-1]:
                    cuts.append(cut)
                break
    bounds = [0, *cuts]
    return [
        (lo, (cuts[j] - 1 if j < len(cuts) else None), j == 0, j == len(cuts))
        for j, lo in enumerate(bounds)
    ]


Task = Tuple[Path, int, Optional[int], bool, bool, Optional[MemoryBudget], float]


def _scan_task(args: Task) -> dec.Columns:
    try:
        return scan_range(*args)
    except (OSError, EOFError, zlib.error, *dec.DecodeError) as exc:
        raise TraceReadError(
            f"cannot read trace {args[0]}: {exc}; is it a complete torch.profiler trace?"
        ) from None


def plan_tasks(
    paths: List[Path], workers: int, budget: Optional[MemoryBudget] = None
) -> List[Task]:
    """One task per file, or several per large plain file when more than one process helps.

    With a budget, each task counts its share of everything read (files are held together)."""
    tasks: List[Task] = []
    can_split = workers > 1
    total = sum(p.stat().st_size for p in paths) or 1
    for path in paths:
        size = path.stat().st_size
        if can_split and not path.name.endswith(".gz") and size >= PARALLEL_MIN_BYTES:
            parts = max(2, workers // max(1, len(paths)))
            ranges = _split_ranges(path, parts)
            tasks += [
                (path, lo, hi, f, la, budget, ((hi or size) - lo) / total)
                for lo, hi, f, la in ranges
            ]
        else:
            tasks.append((path, 0, None, True, True, budget, max(size, 1) / total))
    return tasks


def read_kineto_files(
    paths: List[Path],
    workers: Optional[int] = None,
    budget: Optional[MemoryBudget] = None,
    trim_last_step: bool = True,
) -> Dict[Path, RankTrace]:
    """Read several Kineto traces, in parallel when there is enough work for it."""
    workers = workers or min(MAX_WORKERS, os.cpu_count() or 1)
    tasks = plan_tasks(paths, workers, budget)
    total = sum(p.stat().st_size for p in paths)
    if workers > 1 and len(tasks) > 1 and total >= PARALLEL_MIN_BYTES // 4:
        import multiprocessing

        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
            results = list(pool.map(_scan_task, tasks))
    else:
        results = [_scan_task(t) for t in tasks]
    by_path: Dict[Path, List[dec.Columns]] = {}
    for task, cols in zip(tasks, results):
        by_path.setdefault(task[0], []).append(cols)
    del results
    return {path: finish(path, by_path.pop(path), trim_last_step) for path in list(by_path)}


def read_kineto(path: Path, trim_last_step: bool = True) -> RankTrace:
    """Read one trace in this process (no pool)."""
    return finish(path, [scan_range(path, 0, None, True, True)], trim_last_step)
