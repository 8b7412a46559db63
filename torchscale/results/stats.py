"""Descriptive statistics of per-step samples, the one definition every table and check uses."""

from __future__ import annotations

import math
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
