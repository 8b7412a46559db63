"""Decode blocks of Kineto trace events into columns.

Decoding dominates the cost of reading a large trace, and almost all of it is the allocation of
Python objects. msgspec decodes straight into typed structs and skips every field we do not name
without allocating it; flow (``ph: s/f``), metadata and instant events are tag-dispatched to empty
structs, so they cost almost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Dict, List, Optional, Union

import msgspec
import numpy as np
import pandas as pd

from torchscale.profiling.traces.growing_array import GrowingArray
from torchscale.profiling.traces.model import compact_floats, compact_ints

# Events HTA drops on load (no duration, profiler bookkeeping) or that we never analyse.
SKIPPED_CATEGORIES = frozenset({"Trace", "python_function"})
# CUDA API calls: their correlation id, start, duration and name are kept apart from the events,
# to find each kernel's launch and to count the calls (``api_calls``), then dropped.
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
MEMORY_EVENT = "[memory]"
MEMORY_FIELDS = ("ts", "device_type", "device", "bytes", "allocated", "reserved")
# their keys in a memory event's args
MEMORY_ARGS = {
    "device_type": "Device Type", "device": "Device Id", "bytes": "Bytes",
    "allocated": "Total Allocated", "reserved": "Total Reserved",
}  # fmt: skip


@dataclass
class Columns:
    """Columns of the complete (``ph: X``) events of a byte range, names interned per range."""

    ts: GrowingArray = field(default_factory=GrowingArray)
    dur: GrowingArray = field(default_factory=GrowingArray)
    pid: GrowingArray = field(default_factory=GrowingArray)
    tid: GrowingArray = field(default_factory=GrowingArray)
    stream: GrowingArray = field(default_factory=GrowingArray)
    correlation: GrowingArray = field(default_factory=GrowingArray)
    cat_codes: GrowingArray = field(default_factory=GrowingArray)
    name_codes: GrowingArray = field(default_factory=GrowingArray)
    cats: Dict[str, int] = field(default_factory=dict)
    names: Dict[str, int] = field(default_factory=dict)
    metadata: Dict[str, object] = field(default_factory=dict)
    api_correlation: GrowingArray = field(default_factory=GrowingArray)
    api_ts: GrowingArray = field(default_factory=GrowingArray)
    api_dur: GrowingArray = field(default_factory=GrowingArray)
    api_name: GrowingArray = field(default_factory=GrowingArray)  # codes into ``names``
    # ``[memory]`` instants (torch.profiler's profile_memory): start, device type and id, the
    # allocation's bytes (negative: freed), then the allocator's totals
    memory: Dict[str, GrowingArray] = field(
        default_factory=lambda: {k: GrowingArray() for k in MEMORY_FIELDS}
    )
    events: int = 0  # complete events decoded (kept, API calls and skipped ones)

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns: what the memory budget counts."""
        columns = (self.ts, self.dur, self.pid, self.tid, self.stream, self.correlation)
        api = (self.api_correlation, self.api_ts, self.api_dur, self.api_name)
        held = (*columns, self.cat_codes, self.name_codes, *api, *self.memory.values())
        return sum(c.nbytes for c in held)

    def add_memory(self, values: Dict[str, List[Any]]) -> None:
        for key in MEMORY_FIELDS:
            self.memory[key].append(_floats(values[key]))

    def add(
        self,
        ts: Any,
        dur: Any,
        pid: Any,
        tid: Any,
        stream: Any,
        corr: Any,
        cats: List[str],
        names: List[str],
    ) -> None:
        cat_codes = _intern(cats, self.cats)
        skipped = np.fromiter((c in SKIPPED_CATEGORIES for c in self.cats), bool, len(self.cats))
        api = np.fromiter((c in API_CATEGORIES for c in self.cats), bool, len(self.cats))
        keep = ~(skipped | api)[cat_codes] if len(cat_codes) else np.ones(0, dtype=bool)
        ts = np.asarray(ts, dtype=np.float64)
        corr = _ints(corr)
        calls = api[cat_codes] if len(cat_codes) else keep
        self.events += len(ts)
        name_codes = _intern(names, self.names)
        dur = np.asarray(dur, dtype=np.float64)
        if calls.any():
            self.api_correlation.append(compact_ints(corr[calls]))
            self.api_ts.append(ts[calls])
            self.api_dur.append(compact_floats(dur[calls]))
            self.api_name.append(compact_ints(name_codes[calls]))
        columns = (ts, dur, _ints(pid), _ints(tid), _ints(stream), corr, cat_codes, name_codes)
        if not keep.all():
            columns = tuple(c[keep] for c in columns)
        # Held compact from the first block on: the columns of a large trace are what fills
        # memory (see ``model``); ts stays float64 (absolute microseconds need it).
        columns = (
            columns[0],
            compact_floats(columns[1]),
            *(compact_ints(c) for c in columns[2:]),
        )
        for target, column in zip(
            (
                self.ts,
                self.dur,
                self.pid,
                self.tid,
                self.stream,
                self.correlation,
                self.cat_codes,
                self.name_codes,
            ),
            columns,
        ):
            target.append(column)


def _ints(values: Any) -> np.ndarray:
    """Integers as int64; anything else (a string pid like "Spans", a non-numeric stream) -> -1."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            try:  # ROCm traces write some ids as hex strings ("stream": "0x0")
                out[i] = int(v, 0) if isinstance(v, str) else int(v)
            except (TypeError, ValueError, OverflowError):
                out[i] = -1
        return out


def _floats(values: List[Any]) -> np.ndarray:
    """Numbers as float64; anything else (null, a string, a boolean) -> NaN (an invalid event)."""
    nan = float("nan")
    return np.asarray(
        [v if isinstance(v, (int, float)) and not isinstance(v, bool) else nan for v in values],
        dtype=np.float64,
    )


def _intern(strings: List[str], table: Dict[str, int]) -> np.ndarray:
    """Codes of ``strings`` in ``table`` (extended with new ones); pandas hashes in C."""
    if not strings:
        return np.zeros(0, dtype=np.int32)
    codes, uniques = pd.factorize(np.asarray(strings, dtype=object))
    remap = np.fromiter((table.setdefault(s, len(table)) for s in uniques), np.int32, len(uniques))
    return remap[codes]


class _Args(msgspec.Struct, frozen=True, gc=False):
    stream: Union[int, str, None] = -1
    correlation: Union[int, None] = -1


_NO_ARGS = _Args()


class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = -1
    tid: Union[int, str] = -1
    # A string or null start/duration makes the event invalid (counted), not the trace.
    ts: Union[float, str, None] = float("nan")
    dur: Union[float, str, None] = float("nan")
    args: _Args = _NO_ARGS


_Number = Union[float, str, None]  # strings and nulls become NaN, never a decode error


class _MemoryArgs(msgspec.Struct, frozen=True, gc=False):
    device_type: _Number = msgspec.field(default=None, name="Device Type")
    device: _Number = msgspec.field(default=None, name="Device Id")
    bytes: _Number = msgspec.field(default=None, name="Bytes")
    allocated: _Number = msgspec.field(default=None, name="Total Allocated")
    reserved: _Number = msgspec.field(default=None, name="Total Reserved")


_NO_MEMORY_ARGS = _MemoryArgs()


class _Instant(msgspec.Struct, tag_field="ph", tag="i", gc=False):
    name: str = ""
    ts: _Number = None
    args: _MemoryArgs = _NO_MEMORY_ARGS


# Every other phase decodes to a field-less struct: nothing inside it is allocated.
_OTHER_PHASES = (
    "B",
    "E",
    "I",
    "s",
    "t",
    "f",
    "M",
    "C",
    "b",
    "n",
    "e",
    "P",
    "O",
    "N",
    "D",
    "R",
    "c",
)
_Skipped = tuple(
    msgspec.defstruct(f"_Skip{i}", [], tag_field="ph", tag=p, gc=False)
    for i, p in enumerate(_OTHER_PHASES)
)
_EventUnion = Union[(_Complete, _Instant, *_Skipped)]  # type: ignore[valid-type]  # run time


class _TraceFile(msgspec.Struct, gc=False):
    traceEvents: List[_EventUnion] = []
    distributedInfo: Optional[Dict[str, object]] = None
    baseTimeNanoseconds: Optional[int] = None
    schemaVersion: Optional[int] = None


_events_decoder = msgspec.json.Decoder(List[_EventUnion])
_file_decoder = msgspec.json.Decoder(_TraceFile)
DecodeError: Any = (msgspec.DecodeError, ValueError)
_get = {k: attrgetter(k) for k in ("cat", "name", "pid", "tid", "ts", "dur")}
_get_stream = attrgetter("args.stream")
_get_corr = attrgetter("args.correlation")


def _ints_of(getter: Any, xs: List[Any]) -> np.ndarray:
    try:  # fast path: every value an int
        return np.fromiter(map(getter, xs), np.int64, len(xs))
    except (TypeError, ValueError, OverflowError):
        return _ints([-1 if v is None else v for v in map(getter, xs)])


def _floats_of(getter: Any, xs: List[Any]) -> np.ndarray:
    try:  # fast path: every value a number
        return np.fromiter(map(getter, xs), np.float64, len(xs))
    except (TypeError, ValueError):
        return _floats([getter(x) for x in xs])


def _add_structs(events: List[Any], out: Columns) -> None:
    memory = [e for e in events if e.__class__ is _Instant and e.name == MEMORY_EVENT]
    if memory:
        values = {key: [getattr(e.args, key) for e in memory] for key in MEMORY_ARGS}
        out.add_memory({"ts": [e.ts for e in memory], **values})
    xs = [e for e in events if e.__class__ is _Complete]
    if xs:
        out.add(
            _floats_of(_get["ts"], xs),
            _floats_of(_get["dur"], xs),
            _ints_of(_get["pid"], xs),
            _ints_of(_get["tid"], xs),
            _ints_of(_get_stream, xs),
            _ints_of(_get_corr, xs),
            list(map(_get["cat"], xs)),
            list(map(_get["name"], xs)),
        )


def decode_event_list(buf: Any, out: Columns) -> None:
    """Decode ``[ev, ev, ...]`` (bytes-like) and append its complete events to ``out``.

    Raises ``DecodeError`` when the text is not a JSON array of objects.
    """
    _add_structs(_events_decoder.decode(buf), out)


def decode_trace_object(buf: Any, out: Columns) -> None:
    """Decode a whole ``{..., "traceEvents": [...], ...}`` object: its events and metadata."""
    doc = _file_decoder.decode(buf)
    _add_structs(doc.traceEvents, out)
    meta = {"distributedInfo": doc.distributedInfo, "baseTimeNanoseconds": doc.baseTimeNanoseconds}
    out.metadata.update({k: v for k, v in meta.items() if v is not None})
