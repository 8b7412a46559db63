"""Descriptive statistics of per-step samples, the one definition every table and check uses;
and Student's t quantile (numpy has none, and scipy is not a dependency)."""

from __future__ import annotations

import functools
import math
from statistics import NormalDist
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
from numpy.typing import NDArray


def finite_number(value: Any) -> Optional[float]:
    """``value`` as a float; None where it is missing, not a number, NaN or infinite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def mean(samples: Sequence[float]) -> Optional[float]:
    return float(np.mean(samples)) if len(samples) else None


def time_stats(samples: Union[Sequence[float], NDArray[np.float64]]) -> Optional[Dict[str, float]]:
    """mean, p50/p95/p99 (linear interpolation), min, max, std (population) and cv."""
    if not len(samples):
        return None
    values = np.asarray(samples, dtype=float)
    average = float(values.mean())
    std = float(values.std())
    p50, p95, p99 = (float(v) for v in np.percentile(values, [50, 95, 99]))
    return {
        "mean": average,
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "min": float(values.min()),
        "max": float(values.max()),
        "std": std,
        "cv": std / average if average > 0 else math.nan,
    }


def coefficient_of_variation(samples: Sequence[float]) -> Optional[float]:
    if len(samples) < 2:
        return None
    values = np.asarray(samples, dtype=float)
    average = float(values.mean())
    return float(values.std() / average) if average > 0 else None


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-14
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return result


def _beta_regularized(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


@functools.lru_cache(maxsize=256)
def t_quantile(probability: float, df: Optional[float]) -> float:
    """Student's t quantile (``probability`` > 0.5: the upper one) with ``df`` degrees of
    freedom; the normal quantile when ``df`` is None (a spread taken as known)."""
    if df is None:
        return NormalDist().inv_cdf(probability)
    tail = 2.0 * (1.0 - probability)  # P(|T| > t)

    def beyond(t: float) -> float:
        return _beta_regularized(df / 2.0, 0.5, df / (df + t * t))

    low, high = 0.0, 1.0
    while beyond(high) > tail:
        low, high = high, high * 2.0
    for _ in range(100):
        middle = (low + high) / 2.0
        low, high = (middle, high) if beyond(middle) > tail else (low, middle)
    return (low + high) / 2.0


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (a two-sided test)."""
    if not math.isfinite(t):
        return 0.0
    return _beta_regularized(df / 2.0, 0.5, df / (df + t * t))
