"""Interval arithmetic on arrays of (start, end): the building block of every time breakdown."""

from __future__ import annotations

from typing import Tuple

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays.

    Touching intervals are merged, as HTA's ``merge_kernel_intervals`` does (an interval joins the
    previous group unless it starts strictly after every earlier end).
    """
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, dtype=np.float64)[order], np.asarray(ends, dtype=np.float64)[order]
    running_end = np.maximum.accumulate(e)
    new_group = np.r_[True, s[1:] > running_end[:-1]]
    group_starts = np.flatnonzero(new_group)
    group_last = np.r_[group_starts[1:] - 1, len(s) - 1]
    return s[group_starts], running_end[group_last]


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the (already merged) intervals.

    Summing differences, not ``sum(ends) - sum(starts)``: timestamps are ~1e15 us, and their sums
    would lose whole microseconds to float64 rounding.
    """
    return float(np.sum(np.asarray(ends) - np.asarray(starts))) if len(starts) else 0.0


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    return total(*merge(starts, ends))


def intersection_length(
    a: Tuple[np.ndarray, np.ndarray], b: Tuple[np.ndarray, np.ndarray]
) -> float:
    """Length of time covered by both merged interval sets (inclusion-exclusion on unions)."""
    if not len(a[0]) or not len(b[0]):
        return 0.0
    both = merge(np.r_[a[0], b[0]], np.r_[a[1], b[1]])
    return total(*a) + total(*b) - total(*both)


def covered_between(
    starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Time covered by merged intervals inside each window [lo, hi), for many windows at once."""
    if not len(starts):
        return np.zeros(len(lo))
    done = np.r_[0.0, np.cumsum(ends - starts)]  # covered length before interval k

    def covered_until(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, x, side="right") - 1  # last interval starting at or before x
        inside = np.clip(x - starts[np.maximum(k, 0)], 0.0, None)
        partial = np.minimum(inside, (ends - starts)[np.maximum(k, 0)])
        return np.where(k >= 0, done[np.maximum(k, 0)] + partial, 0.0)

    covered: np.ndarray = covered_until(np.asarray(hi, dtype=float)) - covered_until(
        np.asarray(lo, dtype=float)
    )
    return covered
