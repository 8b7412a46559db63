"""Interval arithmetic on arrays of (start, end): the building block of every time breakdown.

Large traces hold millions of kernels, so the union of intervals is never built whole: in start
order, interval ``i`` adds the segment ``[max(start[i], running_end[i-1]), running_end[i]]``
when it is not empty (everything before ``running_end[i-1]`` from ``start[i]`` on is covered
already: the interval reaching it started no later). Those segments are disjoint, sorted, and
their union is the union of the intervals; :func:`coverage_segments` yields them a chunk at a
time, so a union's length or its share of many windows costs memory of one chunk, not of the
trace (analysis memory grows with the tables it produces, not with the events).
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np

CHUNK_ROWS = 1 << 20
Segments = Tuple[np.ndarray, np.ndarray]


def is_sorted(values: np.ndarray) -> bool:
    return len(values) < 2 or bool(np.all(values[1:] >= values[:-1]))


def coverage_segments(
    starts: np.ndarray,
    ends: Optional[np.ndarray] = None,
    rows: Optional[np.ndarray] = None,
    *,
    durations: Optional[np.ndarray] = None,
) -> Iterator[Segments]:
    """Disjoint, sorted segments whose union is the union of the intervals (of ``rows`` only,
    when given), a chunk of intervals at a time. Intervals are ``starts`` with ``ends``, or with
    ``durations`` (a trace table's columns: the ends are then made a chunk at a time, never for
    the whole table). Unsorted input is sorted first (a copy)."""
    s = np.asarray(starts, dtype=np.float64)
    tail = np.asarray(ends if durations is None else durations)
    if not is_sorted(s):
        order = np.argsort(s, kind="stable")
        s, tail = s[order], tail[order]
        rows = None if rows is None else rows[order]
        del order
    carry = -np.inf
    for lo in range(0, len(s), CHUNK_ROWS):
        hi = lo + CHUNK_ROWS
        chunk_s = s[lo:hi]
        chunk_e = tail[lo:hi] + chunk_s if durations is not None else tail[lo:hi]
        # A row left out counts as an empty interval at its start: it covers nothing, and the
        # running end it leaves (at most its start) changes no later interval's segment.
        if rows is not None:
            chunk_e = np.where(rows[lo:hi], chunk_e, chunk_s)
        running = np.maximum.accumulate(chunk_e.astype(np.float64, copy=False))
        np.maximum(running, carry, out=running)
        before = np.empty_like(running)
        before[0] = carry
        before[1:] = running[:-1]
        np.maximum(before, chunk_s, out=before)
        gained = running > before
        carry = float(running[-1])
        yield before[gained], running[gained]


def union_length(
    starts: np.ndarray,
    ends: Optional[np.ndarray] = None,
    rows: Optional[np.ndarray] = None,
    *,
    durations: Optional[np.ndarray] = None,
) -> float:
    """Time covered by at least one interval (of ``rows`` only, when given); intervals as in
    :func:`coverage_segments`."""
    segments = coverage_segments(starts, ends, rows, durations=durations)
    return sum(total(a, b) for a, b in segments)


def merge(starts: np.ndarray, ends: np.ndarray) -> Segments:
    """Union of intervals as sorted, disjoint (start, end) arrays (built whole: small inputs).

    Touching intervals are merged, as HTA's ``merge_kernel_intervals`` does (an interval joins the
    previous group unless it starts strictly after every earlier end).
    """
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    s, e = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    if not is_sorted(s):
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    running_end = np.maximum.accumulate(e)
    new_group = np.r_[True, s[1:] > running_end[:-1]]
    group_last = np.r_[new_group[1:], True]
    return s[new_group], running_end[group_last]


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by disjoint intervals.

    Summing differences, not ``sum(ends) - sum(starts)``: timestamps are ~1e15 us, and their sums
    would lose whole microseconds to float64 rounding.
    """
    return float(np.sum(np.asarray(ends) - np.asarray(starts))) if len(starts) else 0.0


def covered_between(
    starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Time covered by disjoint sorted intervals inside each window [lo, hi), for many windows."""
    if not len(starts):
        return np.zeros(len(lo))
    lengths = ends - starts
    done = np.r_[0.0, np.cumsum(lengths)]  # covered length before interval k

    def covered_until(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, x, side="right") - 1  # last interval starting at or before x
        at = np.maximum(k, 0)
        partial = np.minimum(np.clip(x - starts[at], 0.0, None), lengths[at])
        return np.where(k >= 0, done[at] + partial, 0.0)

    covered: np.ndarray = covered_until(np.asarray(hi, dtype=float)) - covered_until(
        np.asarray(lo, dtype=float)
    )
    return covered


def covered_in_windows(
    starts: np.ndarray, durations: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Time covered by the union of (any) intervals, given by start and duration, inside each
    window [lo, hi)."""
    covered = np.zeros(len(lo))
    for seg_lo, seg_hi in coverage_segments(starts, durations=durations):
        covered += covered_between(seg_lo, seg_hi, lo, hi)
    return covered
