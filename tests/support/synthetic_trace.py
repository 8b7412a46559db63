"""A synthetic Kineto trace whose every figure is known by hand: the critical-path step of
``tests/test_trace_analyses.py``, repeated.

Step ``k`` starts at ``200 k`` and lasts ``100 + 10 k`` us. Inside it (times from its start): a
batch fetch [0, 10), compute [10, 40) (launched at 5), an all-reduce [40, 60) on stream 20
(launched at 30), a kernel launched late at 65 for 70, compute [70, 80) under an all-reduce [75, 85)
(launched at 66), a copy [90, 95) launched early (at 50: it waited) by a call of 8 us (longer than
the copy: a short kernel), and a tail [95, 100 + 10 k). Every other launching call lasts 1 us.
A last ``ProfilerStep`` follows, empty: the reader leaves it out, as HTA does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from torchscale.profiling.traces import kineto
from torchscale.profiling.traces.model import RankTrace

STEP_SPACING_US = 200
SGEMM = "sgemm"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
COPY = "Memcpy DtoD (Device -> Device)"
FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def kernel(
    name: str,
    ts: float,
    dur: float,
    launch: float,
    stream: int = 7,
    corr: Optional[int] = None,
    call_dur: float = 1,
) -> List[Dict[str, Any]]:
    """A GPU row and the ``cudaLaunchKernel`` call that launched it."""
    return [
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
         "args": {"stream": stream, "correlation": corr}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": launch, "dur": call_dur, "args": {"correlation": corr}},
    ]  # fmt: skip


def _annotation(name: str, ts: float, dur: float) -> Dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur}  # fmt: skip


def step_events(k: int) -> List[Dict[str, Any]]:
    t, corr = STEP_SPACING_US * k, 5 * k
    return [
        _annotation(f"ProfilerStep#{k}", t, 100 + 10 * k),
        _annotation(FETCH, t, 10),
        *kernel(SGEMM, t + 10, 30, t + 5, corr=corr + 1),
        *kernel(ALL_REDUCE, t + 40, 20, t + 30, stream=20, corr=corr + 2),
        *kernel(SGEMM, t + 70, 10, t + 65, corr=corr + 3),
        *kernel(ALL_REDUCE, t + 75, 10, t + 66, stream=20, corr=corr + 4),
        *kernel(COPY, t + 90, 5, t + 50, corr=corr + 5, call_dur=8),
    ]


def synthetic_trace(folder: Path, steps: int = 1) -> RankTrace:
    """``steps`` steps (module docstring) and the empty last one, written and read back."""
    events = [e for k in range(steps) for e in step_events(k)]
    events.append(_annotation(f"ProfilerStep#{steps}", STEP_SPACING_US * steps, 50))
    path = folder / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return kineto.read_kineto(path)
