"""Change points in a series: E-divisive means with a Student's t-test, as Apache Otava does.

E-divisive means (Matteson and James, 2014) splits a series where the energy distance between
the two sides is largest; each split is kept only if a two-sample Student's t-test of the two
sides gives a p-value under ``max_pvalue`` (Otava's significance test, in place of the original
permutation test), then the search goes on in each side. The t-test's variance is the runs' own
scatter around each side's mean, so a change is confirmed against the run-to-run noise of that
series, not against the steps of one run.

A long series is searched in windows of ``window`` runs (Otava's ``window_len``, 50) that overlap
by half; a change found in two windows is one change. Every change kept is tested again against
its neighbours (the runs between it and the changes on either side, at most ``window`` each), and
the weakest is dropped until every one passes. Windows where no split can pass (the largest
t-statistic of any split under the test's threshold) are ruled out with one vectorised pass, so
a history of thousands of runs per series is searched in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from torchscale.measures.stats import t_quantile, t_two_sided_p

MAX_PVALUE = 0.0005
"""A split is a change only if the t-test's p-value is below it. Otava's default is 0.001; on
60-run series of pure noise that flagged 1.7% of series (2,000 series, docs/history.md), over
the 1% goal, so half of it."""
WINDOW = 50
"""Otava's default ``window_len``: runs per window of a long series."""
MIN_SIZE = 3
"""Runs on each side of a change, at least: a change is only reported once three runs after it
agree (HUD calls a regression after two trailing violations; the t-test needs a third to judge
the new level's spread)."""

FALSE_ALARM_GOAL = 0.01
"""At most this share of unchanged series may show a change. A series shorter than a window has
few places to split: the first split is one of ``n - 2 * MIN_SIZE + 1`` t-tests, so testing each
at ``FALSE_ALARM_GOAL`` over that count keeps its false alarms under the goal whichever split the
energy distance picks (Bonferroni), and six runs (three each side) are tested at 1%, not at the
0.05% long series need. Only where that is looser than :data:`MAX_PVALUE` (series under 26
runs); a p-value given by the caller is used as it is."""

Array = NDArray[np.float64]


def default_pvalue(n: int, window: int = WINDOW) -> float:
    """The p-value a split of an ``n``-run series must pass by default (see FALSE_ALARM_GOAL)."""
    if n > window:
        return MAX_PVALUE
    splits = max(n - 2 * MIN_SIZE + 1, 1)
    return max(MAX_PVALUE, FALSE_ALARM_GOAL / splits)


@dataclass(frozen=True)
class Split:
    """A change at index ``at`` (the first run after it) of a series."""

    at: int
    pvalue: float
    before: float
    after: float
    before_half_width: float  # 95% interval of each side's mean
    after_half_width: float

    @property
    def magnitude(self) -> float:
        """after / before - 1."""
        return self.after / self.before - 1.0 if self.before else math.inf


def _energy(x: Array) -> Array:
    """Q(tau) for every split tau of ``x`` (one window): Matteson and James's scaled energy
    distance between x[:tau] and x[tau:]; -inf where a side has fewer than MIN_SIZE runs."""
    n = len(x)
    distance = np.abs(x[:, None] - x[None, :])
    prefix = np.zeros((n + 1, n + 1))
    prefix[1:, 1:] = distance.cumsum(0).cumsum(1)
    tau = np.arange(n + 1)
    left = prefix[tau, tau] / 2.0  # pairs within x[:tau]
    between = prefix[tau, n] - prefix[tau, tau]
    right = (prefix[n, n] - 2.0 * prefix[tau, n] + prefix[tau, tau]) / 2.0
    a = tau.astype(float)
    b = float(n) - a
    q = np.full(n + 1, -np.inf)
    ok = (tau >= MIN_SIZE) & (tau <= n - MIN_SIZE)
    a, b = a[ok], b[ok]
    within = left[ok] / (a * (a - 1) / 2) + right[ok] / (b * (b - 1) / 2)
    energy = 2.0 * between[ok] / (a * b) - within
    q[ok] = a * b / (a + b) * energy
    return q


@cache
def _t_quantile(probability: float, df: int) -> float:
    """:func:`t_quantile`, remembered: its bisection costs about a millisecond, and a history
    asks for the same few degrees of freedom thousands of times."""
    return t_quantile(probability, df)


def _pvalue(left: Array, right: Array) -> Tuple[float, float, float, float, float]:
    """Student's two-sample t-test (pooled variance): p-value, means and sample variances."""
    n1, n2 = len(left), len(right)
    m1, m2 = float(left.mean()), float(right.mean())
    v1 = float(left.var(ddof=1)) if n1 > 1 else 0.0
    v2 = float(right.var(ddof=1)) if n2 > 1 else 0.0
    df = n1 + n2 - 2
    pooled = ((n1 - 1) * v1 + (n2 - 1) * v2) / df if df > 0 else 0.0
    scale = math.sqrt(pooled * (1.0 / n1 + 1.0 / n2))
    p = (0.0 if m1 != m2 else 1.0) if scale == 0.0 else t_two_sided_p((m2 - m1) / scale, df)
    return p, m1, m2, v1, v2


def _t_test(left: Array, right: Array) -> Tuple[float, float, float, float, float]:
    """:func:`_pvalue` with each side's 95% half-width in place of its variance."""
    n1, n2 = len(left), len(right)
    p, m1, m2, v1, v2 = _pvalue(left, right)
    h1 = _t_quantile(0.975, n1 - 1) * math.sqrt(v1 / n1) if n1 > 1 else math.inf
    h2 = _t_quantile(0.975, n2 - 1) * math.sqrt(v2 / n2) if n2 > 1 else math.inf
    return p, m1, m2, h1, h2


def _split(x: Array, at: int) -> Split:
    p, m1, m2, h1, h2 = _t_test(x[:at], x[at:])
    return Split(at, p, m1, m2, h1, h2)


def _divide(x: Array, max_pvalue: float) -> List[int]:
    """E-divisive on one window: the significant splits, as indices into ``x``."""
    found: List[int] = []
    while True:
        bounds = [0, *sorted(found), len(x)]
        best: Optional[Tuple[float, int, int, int]] = None
        for start, end in zip(bounds, bounds[1:]):
            if end - start < 2 * MIN_SIZE:
                continue
            q = _energy(x[start:end])
            tau = int(np.argmax(q))
            if np.isfinite(q[tau]) and (best is None or q[tau] > best[0]):
                best = (float(q[tau]), start + tau, start, end)
        if best is None:
            return found
        _, at, start, end = best
        if _pvalue(x[start:at], x[at:end])[0] >= max_pvalue:
            return found
        found.append(at)


def _windows(n: int, window: int) -> List[int]:
    if n <= window:
        return [0]
    starts = list(range(0, n - window, window // 2))
    return [*starts, n - window]


def _may_split(x: Array, starts: Sequence[int], window: int, max_pvalue: float) -> List[int]:
    """The windows in which some split's t-statistic passes the test (others cannot hold a
    change), found for all windows at once from prefix sums."""
    if len(starts) == 1:
        return list(starts)
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])
    start = np.asarray(starts)[:, None]
    tau = np.arange(MIN_SIZE, window - MIN_SIZE + 1)[None, :]
    n1, n2 = tau.astype(float), float(window) - tau
    mid, end = start + tau, start + window
    sum1, sum2 = s1[mid] - s1[start], s1[end] - s1[mid]
    sq1, sq2 = s2[mid] - s2[start], s2[end] - s2[mid]
    ss = (sq1 - sum1 * sum1 / n1) + (sq2 - sum2 * sum2 / n2)
    pooled = np.maximum(ss, 0.0) / (window - 2)
    scale = np.sqrt(pooled * (1.0 / n1 + 1.0 / n2))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(sum2 / n2 - sum1 / n1) / scale
    t = np.where(scale > 0, t, np.where(np.abs(sum2 / n2 - sum1 / n1) > 0, np.inf, 0.0))
    threshold = _t_quantile(1.0 - max_pvalue / 2.0, window - 2)
    passing: List[bool] = np.asarray((t >= threshold).any(axis=1)).tolist()
    return [int(s) for s, ok in zip(starts, passing) if ok]


def change_points(
    values: Sequence[float], max_pvalue: Optional[float] = None, window: int = WINDOW
) -> List[Split]:
    """The change points of ``values`` (oldest first), each tested against its neighbours;
    ``max_pvalue`` None: :func:`default_pvalue` for the series' length."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2 * MIN_SIZE:
        return []
    window = max(window, 2 * MIN_SIZE)
    if max_pvalue is None:
        max_pvalue = default_pvalue(n, window)
    candidates: List[int] = []
    for start in _may_split(x, _windows(n, window), min(window, n), max_pvalue):
        for at in _divide(x[start : start + window], max_pvalue):
            candidates.append(start + at)
    # the same change seen from two windows is one change: keep the strongest of a cluster
    kept: List[int] = []
    for at in sorted(set(candidates)):
        if kept and at - kept[-1] < MIN_SIZE:
            moved = _neighbour_p(x, [*kept[:-1], at], at, window)
            if moved < _neighbour_p(x, kept, kept[-1], window):
                kept[-1] = at
            continue
        kept.append(at)
    while kept:
        pvalues = [_neighbour_p(x, kept, at, window) for at in kept]
        worst = int(np.argmax(pvalues))
        if pvalues[worst] < max_pvalue:
            break
        kept.pop(worst)
    splits = []
    for index, at in enumerate(kept):
        low = max(kept[index - 1] if index else 0, at - window)
        high = min(kept[index + 1] if index + 1 < len(kept) else n, at + window)
        split = _split(x[low:high], at - low)
        splits.append(
            Split(
                at,
                split.pvalue,
                split.before,
                split.after,
                split.before_half_width,
                split.after_half_width,
            )
        )
    return splits


def _neighbour_p(x: Array, kept: Sequence[int], at: int, window: int) -> float:
    ordered = sorted(kept)
    index = ordered.index(at)
    low = max(ordered[index - 1] if index else 0, at - window)
    high = min(ordered[index + 1] if index + 1 < len(ordered) else len(x), at + window)
    if at - low < 2 or high - at < 2:
        return 1.0
    return _pvalue(x[low:at], x[at:high])[0]
